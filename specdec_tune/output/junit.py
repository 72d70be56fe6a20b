"""JUnit XML of a `check` report: one test case per compared metric, so CI systems show a
regression as a failed test and "inconclusive" as a skipped one.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from .check import CheckReport


def junit_xml(report: CheckReport) -> str:
    """JUnit XML: one test case per compared metric, so CI systems show a regression as a failed test."""
    failures = sum(not i.ok for i in report.items)
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuites tests="{len(report.items)}" failures="{failures}" time="{report.seconds:.3f}">',
        f'  <testsuite name={quoteattr("specdec-tune check " + report.profile)} tests="{len(report.items)}" '
        f'failures="{failures}" time="{report.seconds:.3f}">',
    ]
    for i in report.items:
        name = quoteattr(f"{report.config}: {i.metric}")
        detail = f"stored {i.stored}, measured {i.measured}" + (f" ({i.note})" if i.note else "")
        if i.inconclusive:
            lines.append(f'    <testcase classname="specdec_tune.check" name={name}>')
            lines.append(
                f"      <skipped message={quoteattr('inconclusive: too noisy')}>{escape(detail)}</skipped>"
            )
            lines.append("    </testcase>")
        elif i.ok:
            lines.append(f'    <testcase classname="specdec_tune.check" name={name}>')
            lines.append(f"      <system-out>{escape(detail)}</system-out>")
            lines.append("    </testcase>")
        else:
            lines.append(f'    <testcase classname="specdec_tune.check" name={name}>')
            lines.append(
                f"      <failure message={quoteattr(i.metric + ' regressed')}>{escape(detail)}</failure>"
            )
            lines.append("    </testcase>")
    lines += ["  </testsuite>", "</testsuites>", ""]
    return "\n".join(lines)
