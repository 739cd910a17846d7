"""xpatch's version, read once from the installed package's metadata."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("xarray-patch")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    VERSION = "0+unknown"
