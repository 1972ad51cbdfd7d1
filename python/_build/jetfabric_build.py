"""A PEP 517 build backend in the standard library alone, for the jetfabric
package: it writes a pure-Python wheel of jetfabric/ (and an sdist), so pip
builds the package offline, with no setuptools or wheel to fetch."""

import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME = "jetfabric"
VERSION = "0.1.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG = "py3-none-any"
DIST_INFO = "%s-%s.dist-info" % (NAME, VERSION)

METADATA = """Metadata-Version: 2.1
Name: {name}
Version: {version}
Summary: Python client for the jetfabric tensor compute fabric (NATS JetStream)
Requires-Python: >=3.8
Provides-Extra: numpy
Requires-Dist: numpy; extra == "numpy"
""".format(name=NAME, version=VERSION)

WHEEL = """Wheel-Version: 1.0
Generator: jetfabric_build
Root-Is-Purelib: true
Tag: {tag}
""".format(tag=TAG)


def _package_files():
    pkg = os.path.join(ROOT, NAME)
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py") or f == "py.typed":
                full = os.path.join(dirpath, f)
                yield full, os.path.relpath(full, ROOT).replace(os.sep, "/")


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, digest, len(data))


def _write_wheel(wheel_directory, files):
    name = "%s-%s-%s.whl" % (NAME, VERSION, TAG)
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in files:
            z.writestr(arc, data)
            records.append(_record_line(arc, data))
        for arc, data in ((DIST_INFO + "/METADATA", METADATA.encode()), (DIST_INFO + "/WHEEL", WHEEL.encode())):
            z.writestr(arc, data)
            records.append(_record_line(arc, data))
        records.append(DIST_INFO + "/RECORD,,")
        z.writestr(DIST_INFO + "/RECORD", "\n".join(records) + "\n")
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, DIST_INFO)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(METADATA)
    with open(os.path.join(d, "WHEEL"), "w") as f:
        f.write(WHEEL)
    return DIST_INFO


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    for full, arc in _package_files():
        with open(full, "rb") as f:
            files.append((arc, f.read()))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [("%s.pth" % NAME, (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, VERSION)
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/jetfabric_build.py"]:
            full = os.path.join(ROOT, rel)
            if os.path.exists(full):
                t.add(full, arcname=base + "/" + rel)
        for full, arc in _package_files():
            t.add(full, arcname=base + "/" + arc)
        info = tarfile.TarInfo(base + "/PKG-INFO")
        data = METADATA.encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return name
