"""Loaded by every Python process started with this folder on PYTHONPATH: in the shared
forward's driver (and only there) it installs the key-check probe (bench/key_check_probe.py)."""

from __future__ import annotations

import sys

if sys.argv and sys.argv[0].endswith("shared_forward.py"):
    from bench.key_check_probe import install

    install()
