"""Fetching the corpus's Debian packages without installing them: ``apt-get download`` (no root needed) and
``dpkg -x`` into a cache folder. Nothing is fetched that is already there."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from regis.errors import ConfigError

EXTRACTED_MARK = ".regis-extracted"


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    if shutil.which(cmd[0]) is None:
        raise ConfigError(f"{cmd[0]} is not installed: the Debian corpus needs a Debian or Ubuntu system "
                          "(apt-get and dpkg)")
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise ConfigError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {tail[0]}")
    return proc.stdout


def find_deb(debs: Path, package: str) -> Path | None:
    """The newest-named ``<package>_*.deb`` in ``debs``, or None."""
    found = sorted(Path(debs).glob(f"{package}_*.deb"))
    return found[-1] if found else None


def download(package: str, debs: Path) -> Path:
    """The package's .deb in ``debs``, downloaded with ``apt-get download`` when it is not there yet.

    Raises:
        ConfigError: apt-get is missing or fails (unknown package, no network: run ``apt-get update`` first).
    """
    debs = Path(debs)
    debs.mkdir(parents=True, exist_ok=True)
    deb = find_deb(debs, package)
    if deb is None:
        _run(["apt-get", "download", package], cwd=debs)
        deb = find_deb(debs, package)
        if deb is None:
            raise ConfigError(f"apt-get download {package} wrote no .deb into {debs}")
    return deb


def deb_version(deb: Path) -> str:
    """The package version recorded in a .deb (``dpkg-deb -f DEB Version``)."""
    return _run(["dpkg-deb", "-f", str(deb), "Version"]).strip()


def extract(deb: Path, dest: Path) -> Path:
    """``dpkg -x DEB DEST`` once (a marker file says it is done); returns ``dest``."""
    dest = Path(dest)
    mark = dest / EXTRACTED_MARK
    if mark.is_file() and mark.read_text() == deb.name:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    _run(["dpkg", "-x", str(deb), str(tmp)])
    (tmp / EXTRACTED_MARK).write_text(deb.name)
    tmp.rename(dest)
    return dest


def fetch_packages(packages: tuple[str, ...], cache: Path) -> dict[str, tuple[Path, str]]:
    """Download and extract each package under ``cache`` (``debs/`` and ``extracted/<package>/``).

    Returns:
        {package: (extracted root, version)}.
    """
    out = {}
    for package in packages:
        deb = download(package, Path(cache) / "debs")
        out[package] = (extract(deb, Path(cache) / "extracted" / package), deb_version(deb))
    return out
