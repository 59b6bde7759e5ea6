"""Package discovery for setuptools: every package under trtflow/ and stages/ (installed as trtflow_stages) is
found, none is listed by hand, so a new sub-package is always installed. Everything else is in pyproject.toml;
tests/test_packaging.py builds the wheel and compares it with the source tree.
"""

from setuptools import find_packages, setup


def _packages(folder: str, name: str) -> list[str]:
    """``name`` and its sub-packages (folders with an ``__init__.py``) found under ``folder``."""
    return [name, *(f"{name}.{sub}" for sub in find_packages(folder))]


setup(packages=_packages("trtflow", "trtflow") + _packages("stages", "trtflow_stages"))
