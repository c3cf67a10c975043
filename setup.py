"""Which packages the distribution holds; everything else is in pyproject.toml.

The repository's ``plugins/`` folder is installed as the package ``gskit_plugins`` (registered under the
``gskit.plugins`` entry point in pyproject.toml). Its plugin folders are found here on disk, so adding a
plugin folder changes no file outside it; their non-Python files (READMEs, C++ sources, CMake files)
come in through MANIFEST.in.
"""

from setuptools import find_namespace_packages, setup

PLUGIN_PACKAGE, PLUGIN_DIR = "gskit_plugins", "plugins"
# Folders of data files (gskit/data, a plugin's cpp/) count as packages too, so setuptools ships them
# without warnings; build outputs do not.
NOT_PACKAGES = ["*__pycache__", "*.build", "*.build.*", "build", "build.*"]

setup(
    packages=[
        *find_namespace_packages(include=["gskit", "gskit.*"], exclude=NOT_PACKAGES),
        PLUGIN_PACKAGE,
        *(f"{PLUGIN_PACKAGE}.{name}" for name in find_namespace_packages(PLUGIN_DIR, exclude=NOT_PACKAGES)),
    ],
    package_dir={PLUGIN_PACKAGE: PLUGIN_DIR},
)
