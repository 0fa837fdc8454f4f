# The name, version and architecture of a .deb or .rpm on the controller, read from the file
# itself (ar + control.tar for a .deb, the header for an .rpm) in plain Python: the role
# installs the package only when the target has another version, without copying it into the
# image first and without dpkg or rpm on the controller.
from __future__ import annotations

import io
import struct
import tarfile

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: shim_agent_package
short_description: name, version and architecture of a .deb or .rpm on the controller
description:
  - Reads the package's own metadata (a .deb's control file, an .rpm's header); needs neither
    dpkg nor rpm on the controller.
  - Returns one mapping per file with C(path) (absolute), C(format) (deb or rpm), C(name),
    C(version) (a .deb's Version; an .rpm's [epoch:]version-release, the epoch only when the
    package has one) and C(arch).
options:
  _terms:
    description: Paths of package files (relative ones are looked up like the file lookup's).
    required: true
"""

RETURN = r"""
_raw:
  description: one mapping per path
  type: list
  elements: dict
"""


class PackageError(Exception):
    pass


def deb_info(data):
    """Package, Version and Architecture from the control file of a .deb (an ar archive)."""
    if data[:8] != b"!<arch>\n":
        raise PackageError("not a .deb (no ar magic)")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise PackageError("a malformed ar member header")
        member = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if not name.startswith("control.tar"):
            continue
        if name.endswith(".zst"):
            raise PackageError("control.tar.zst is not readable here (build the .deb with xz or gzip)")
        with tarfile.open(fileobj=io.BytesIO(member), mode="r:*") as tar:
            for entry in tar.getmembers():
                if entry.name in ("./control", "control"):
                    text = tar.extractfile(entry).read().decode("utf-8")
                    break
            else:
                raise PackageError("no control file in " + name)
        fields = {}
        for line in text.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, value = line.split(":", 1)
                fields[key.strip()] = value.strip()
        return {"format": "deb", "name": fields.get("Package", ""),
                "version": fields.get("Version", ""), "arch": fields.get("Architecture", "")}
    raise PackageError("no control.tar member")


RPM_NAME, RPM_VERSION, RPM_RELEASE, RPM_EPOCH, RPM_ARCH = 1000, 1001, 1002, 1003, 1022
RPM_INT32, RPM_STRING = 4, 6


def rpm_header(data, pos):
    """The tags of the rpm header at pos, and the offset after it."""
    if data[pos:pos + 3] != b"\x8e\xad\xe8":
        raise PackageError("no rpm header magic at offset %d" % pos)
    count, size = struct.unpack(">II", data[pos + 8:pos + 16])
    store = pos + 16 + 16 * count
    tags = {}
    for i in range(count):
        tag, kind, offset, n = struct.unpack(">iiii", data[pos + 16 + 16 * i:pos + 32 + 16 * i])
        if kind == RPM_STRING:
            end = data.index(b"\0", store + offset)
            tags[tag] = data[store + offset:end].decode("utf-8")
        elif kind == RPM_INT32 and n >= 1:
            tags[tag] = struct.unpack(">i", data[store + offset:store + offset + 4])[0]
    return tags, store + size


def rpm_info(data):
    """Name, [epoch:]version-release and architecture from an .rpm's header."""
    if data[:4] != b"\xed\xab\xee\xdb":
        raise PackageError("not an .rpm (no lead magic)")
    _, end = rpm_header(data, 96)               # the signature header, padded to 8 bytes
    tags, _ = rpm_header(data, (end + 7) & ~7)
    epoch = tags.get(RPM_EPOCH)
    version = "%s-%s" % (tags.get(RPM_VERSION, ""), tags.get(RPM_RELEASE, ""))
    return {"format": "rpm", "name": tags.get(RPM_NAME, ""),
            "version": ("%d:%s" % (epoch, version)) if epoch is not None else version,
            "arch": tags.get(RPM_ARCH, "")}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        out = []
        for term in terms:
            path = self.find_file_in_search_path(variables, "files", term)
            if not path:
                raise AnsibleLookupError("shim_agent_package: no file %s on the controller" % term)
            with open(path, "rb") as f:
                data = f.read()
            try:
                info = rpm_info(data) if data[:4] == b"\xed\xab\xee\xdb" else deb_info(data)
            except (PackageError, tarfile.TarError, struct.error, ValueError) as e:
                raise AnsibleLookupError("shim_agent_package: %s: %s" % (path, e))
            if not info["name"] or not info["version"]:
                raise AnsibleLookupError("shim_agent_package: %s: no name or version in it" % path)
            info["path"] = path
            out.append(info)
        return out
