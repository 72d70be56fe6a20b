"""llama.cpp's own defaults per n-gram spec type (`args.ENGINE_DEFAULTS`) are what the installed
llama-server says they are, and each runs as exactly those flags."""

from __future__ import annotations

import re
import subprocess

import pytest

from specdec_tune.domain import Config
from specdec_tune.measure.llamacpp.args import (
    ENGINE_DEFAULTS,
    engine_default_configs,
    parse_llamacpp_draft,
    spec_args,
)


def _help_text() -> str:
    from specdec_tune.measure.llamacpp.server import find_server

    try:
        binary = find_server(None)
    except Exception:
        pytest.skip("no llama-server: the [llamacpp] extra is not installed")
    done = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def _help_defaults() -> dict[str, int]:
    # "--spec-ngram-mod-n-min N   minimum number ... (default: 48)", wrapped over lines
    flat = re.sub(r"\s+", " ", _help_text())
    found = re.findall(r"(--spec-ngram-[a-z0-9-]+) N (?:(?!--spec).)*?\(default: (\d+)\)", flat)
    return {flag: int(value) for flag, value in found}


def test_the_defaults_are_the_installed_servers():
    help_defaults = _help_defaults()
    flags = {}
    for config in engine_default_configs():
        argv = spec_args(config)
        flags.update({k: int(v) for k, v in zip(argv[::2], argv[1::2], strict=True) if v.isdigit()})
    assert len(flags) == 9  # simple, map-k, map-k4v: size-n and size-m; mod: n-match, n-min, n-max
    for flag, value in flags.items():
        assert help_defaults[flag] == value, flag


def test_one_default_per_spec_type_and_each_names_its_type():
    configs = engine_default_configs()
    assert [spec_args(c)[1] for c in configs] == list(ENGINE_DEFAULTS)
    mod = dict(zip(spec_args(configs[3])[::2], spec_args(configs[3])[1::2], strict=True))
    assert mod["--spec-ngram-mod-n-min"] == "48" and mod["--spec-ngram-mod-n-max"] == "64"


def test_a_draft_models_written_n_min_is_the_installed_servers_default(tmp_path):
    # the measured server (and so the export) writes --spec-draft-n-min 0 for a draft model that
    # sets none, so that the stored command says it whatever a build's default: here it changes nothing
    gguf = tmp_path / "d.gguf"
    gguf.write_bytes(b"GGUF")
    argv = spec_args(Config(parse_llamacpp_draft(str(gguf)), 4))
    assert argv[argv.index("--spec-draft-n-min") + 1] == "0"
    flat = re.sub(r"\s+", " ", _help_text())
    assert re.search(r"--spec-draft-n-min N (?:(?!--spec).)*?\(default: 0\)", flat)
