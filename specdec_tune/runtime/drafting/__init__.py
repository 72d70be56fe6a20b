"""Drafters: the proposers (`drafters`), the hybrid of sources (`hybrid`), the lean Llama draft forward
(`leandraft`), gamma policies (`policies`) and the factory that builds any of them (`build`).
"""
