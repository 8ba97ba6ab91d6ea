"""A thin shim: the metadata and build settings live in pyproject.toml (PEP 621)."""

from setuptools import setup

setup()
