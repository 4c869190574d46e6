"""Only the package list lives here; everything else is declared in pyproject.toml.

pyproject.toml cannot combine a found package list with one renamed folder (models/ installs as
`edge_runtime_models`), so the list is computed: every folder of edge_runtime/ (namespace folders too,
for the status page's static files), never a hand-kept list that falls behind the tree.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["edge_runtime", "edge_runtime.*"], exclude=["*.__pycache__"]),
              "edge_runtime_models"],
    package_dir={"edge_runtime_models": "models"},
)
