"""Package discovery for setuptools: every package under trtflow/ and stages/ (installed as trtflow_stages) is
found, none is listed by hand, so a new sub-package is always installed. Everything else is in pyproject.toml;
tests/test_packaging.py builds the wheel and compares it with the source tree.
"""

from setuptools import find_namespace_packages, setup


def _packages(folder: str, name: str) -> list[str]:
    """``name`` and every folder under ``folder`` as its sub-packages: those with an ``__init__.py`` and those
    that hold only data (report templates), which setuptools wants listed as packages too."""
    found = find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])
    return [name, *(f"{name}.{sub}" for sub in found)]


setup(packages=_packages("trtflow", "trtflow") + _packages("stages", "trtflow_stages"))
