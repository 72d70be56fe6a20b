"""Drafters: the proposers (`drafters`), the row-keyed interface and its batch-1 adapters (`rows`),
the hybrid of sources (`hybrid`), the lean Llama draft forward (`leandraft`), gamma policies
(`policies`) and the factory that builds any of them (`build`).
"""
