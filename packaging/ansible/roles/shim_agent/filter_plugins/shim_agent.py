# shim_agent_manifests: the role's Shims (mappings or YAML text, in order) as the YAML text that
# `shim-agent install -f -` reads, with the names of the Shims in each, for the task labels.
from __future__ import annotations

import yaml

from ansible.errors import AnsibleFilterError


def _plain(value):
    """A copy built of plain dicts, lists and scalars (Ansible hands over its own types)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return str(value)
    return value


def shim_agent_manifests(items):
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            docs = [_plain(item)]
            text = yaml.safe_dump(docs[0], default_flow_style=False, sort_keys=False)
        elif isinstance(item, str):
            text = str(item)
            try:
                docs = [d for d in yaml.safe_load_all(text) if d is not None]
            except yaml.YAMLError as e:
                raise AnsibleFilterError("Shim item %d is not YAML: %s" % (i + 1, e))
        else:
            raise AnsibleFilterError("Shim item %d is a %s: give a Shim (a mapping) or YAML text"
                                     % (i + 1, type(item).__name__))
        names = []
        for d in docs:
            if not isinstance(d, dict) or d.get("kind") != "Shim":
                raise AnsibleFilterError("Shim item %d holds a document that is not a Shim (kind: %s)"
                                         % (i + 1, d.get("kind") if isinstance(d, dict) else type(d).__name__))
            names.append(str((d.get("metadata") or {}).get("name", "?")))
        if not names:
            raise AnsibleFilterError("Shim item %d holds no Shim" % (i + 1))
        out.append({"names": names, "text": text})
    return out


class FilterModule:
    def filters(self):
        return {"shim_agent_manifests": shim_agent_manifests}
