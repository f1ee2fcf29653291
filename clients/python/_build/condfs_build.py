"""A PEP 517 build backend of the standard library only.

condfs's machines have no Python package index, and a fresh venv's
setuptools may lack ``wheel``: this backend builds the wheel (and an sdist)
of the ``condfs`` package with ``zipfile`` and ``tarfile`` alone, so that
``pip install --no-index ./clients/python`` works offline. It reads the
``[project]`` table's plain string fields from pyproject.toml (without
``tomllib``, which Python 3.10 lacks).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "condfs"


def _project() -> dict[str, str]:
    with open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if table is None:
        raise RuntimeError("pyproject.toml has no [project] table")
    fields = dict(re.findall(r'^([A-Za-z-]+)\s*=\s*"([^"]*)"\s*$', table.group(1), re.M))
    for need in ("name", "version"):
        if need not in fields:
            raise RuntimeError(f"pyproject.toml: [project] needs {need}")
    return fields


def _metadata() -> str:
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    lines += ["License: Apache-2.0", "Classifier: Typing :: Typed"]
    body = ""
    readme = os.path.join(_ROOT, "README.md")
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = "\n" + f.read()
    return "\n".join(lines) + "\n" + body


def _package_files() -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(_ROOT, _PACKAGE)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py") or name == "py.typed":
                out.append(os.path.relpath(os.path.join(dirpath, name), _ROOT))
    return out


def _dist_info() -> str:
    p = _project()
    return f"{p['name']}-{p['version']}.dist-info"


def _wheel_name() -> str:
    p = _project()
    return f"{p['name']}-{p['version']}-py3-none-any.whl"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def _write_wheel(directory: str, files: dict[str, bytes]) -> str:
    info = _dist_info()
    files[f"{info}/METADATA"] = _metadata().encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: condfs_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{name},{_record_hash(data)}" for name, data in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = _wheel_name()
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files.items():
            zi = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return name


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: Any = None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Any = None) -> str:
    info = os.path.join(metadata_directory, _dist_info())
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    with open(os.path.join(info, "WHEEL"), "w", encoding="utf-8") as f:
        f.write("Wheel-Version: 1.0\nGenerator: condfs_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return _dist_info()


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None) -> str:
    files: dict[str, bytes] = {}
    for rel in _package_files():
        with open(os.path.join(_ROOT, rel), "rb") as f:
            files[rel.replace(os.sep, "/")] = f.read()
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: str | None = None) -> str:
    # A .pth file puts the source tree on the path: edits show at once.
    return _write_wheel(wheel_directory, {"condfs_editable.pth": (_ROOT + "\n").encode()})


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    p = _project()
    base = f"{p['name']}-{p['version']}"
    rels = ["pyproject.toml", "README.md", "_build/condfs_build.py"] + _package_files()
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for rel in rels:
            path = os.path.join(_ROOT, rel)
            if os.path.exists(path):
                t.add(path, arcname=f"{base}/{rel}")
        pkg = f"Metadata-Version: 2.1\nName: {p['name']}\nVersion: {p['version']}\n".encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(pkg)
        t.addfile(ti, io.BytesIO(pkg))
    return name
