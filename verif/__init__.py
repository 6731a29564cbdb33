"""Verification flows over the whole suite: the nightly regression (``regress``), the
mutation score (``mutate``) and Verilator lint of every design (``lint``)."""
