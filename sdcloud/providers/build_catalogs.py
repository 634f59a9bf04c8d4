"""Rebuild every bundled price catalog (each provider's catalog.csv) and sdcloud/data/gpus.csv from public figures.

    python -m sdcloud.providers.build_catalogs [--shared ../shared/data] [--check]

Each provider with a catalog names the module that builds its rows (`PriceCatalog.build`, its
`catalog_build.py`, whose docstring lists its inputs); the shared pieces and gpus.csv's speed
columns are offers/build_catalog.py's. --check compares the result with the bundled files and
exits 1 if they differ (tests/test_offers.py runs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..offers.build_catalog import build_gpus, to_csv
from ..offers.gpus import gpu_table
from . import loader
from .traits import has_catalog, names, package_of, traits

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SHARED = REPO.parent / "shared" / "data"
# The file whose presence says the shared reference data is there at all.
SENTINEL = "prices/aws_gpu_regions_skypilot_catalog.csv"
GPUS_PATH = "sdcloud/data/gpus.csv"


def built() -> tuple[str, ...]:
    """The providers whose bundled catalog is a build's output."""
    return names(where=lambda t: has_catalog(t) and t.catalog.build is not None)


def build_all(shared: Path) -> dict[str, str]:
    """{provider: CSV text} as the bundled files must read."""
    return {name: to_csv(loader.catalog_build(name)(shared)) for name in built()}


def bundled_path(provider: str) -> Path:
    """The provider's bundled catalog in this checkout (its folder under sdcloud/providers/)."""
    catalog = traits(provider).catalog
    assert catalog is not None, provider
    return REPO.joinpath(*package_of(provider).split(".")) / catalog.bundled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sdcloud.providers.build_catalogs", description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=DEFAULT_SHARED, help="the shared reference data folder")
    parser.add_argument("--check", action="store_true", help="compare with the bundled files instead of writing them")
    args = parser.parse_args(argv)
    if not (args.shared / SENTINEL).exists():
        print(f"error: {args.shared / SENTINEL} is absent: the shared reference data is needed", file=sys.stderr)
        return 2
    catalogs = build_all(args.shared)
    stale = []
    gpus_text, gpus_path = build_gpus(), REPO / GPUS_PATH
    if args.check:
        if not gpus_path.exists() or gpus_path.read_text() != gpus_text:
            stale.append(str(gpus_path))
    elif gpus_path.read_text() != gpus_text:
        gpus_path.write_text(gpus_text)
        gpu_table.cache_clear()
        catalogs = build_all(args.shared)  # usable MiB and names come from gpus.csv
        print(f"wrote {gpus_path}")
    for provider, text in catalogs.items():
        path = bundled_path(provider)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
            print(f"wrote {path} ({text.count(chr(10)) - 1} rows)")
    if stale:
        print("error: not the build's output (run python -m sdcloud.providers.build_catalogs): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
