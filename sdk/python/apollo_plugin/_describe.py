"""What a plugin says of itself (describe), checked, and its params checked
against it with the agent's wording."""
import difflib
import json
import re

# A param's declared type: what a value of it may be. "a|b" is either.
_KINDS = {
    "string": (str,),
    "path": (str,),
    "url": (str,),
    "hex": (str,),
    "char": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "duration": (str, int, float),
    "list": (list,),
    "mapping": (dict,),
    "map": (dict,),
    "json": None,  # anything
}
_NAMES = {
    "string": "a string",
    "path": "a path (a string)",
    "url": "a URL (a string)",
    "hex": "a hex string",
    "char": "a single character",
    "number": "a number",
    "integer": "an integer",
    "boolean": "a boolean",
    "duration": "a duration (30s, 5m or seconds)",
    "list": "a list",
    "mapping": "a mapping",
    "map": "a mapping",
}
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class DescribeError(Exception):
    """A describe that is not valid: `field` names what is wrong."""

    def __init__(self, field, message):
        super().__init__("%s: %s" % (field, message))
        self.field = field


class Param:
    """A parameter the plugin takes.

    `type` is one of string, path, url, hex, char, number, integer, boolean,
    duration, list, mapping, json, or several joined by "|" (string|list).
    A `default` is filled in before validate and execute see the params.
    """

    def __init__(self, name, type="string", required=False, description="", default=None):
        self.name, self.type, self.required = name, type, required
        self.description, self.default = description, default

    def as_json(self):
        out = {"name": self.name, "type": self.type, "required": self.required, "description": self.description}
        if self.default is not None:
            out["default"] = self.default
        return out


def kind(value):
    """The agent's name for the kind of a JSON value."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _param(i, p):
    field = "params[%d]" % i
    if isinstance(p, Param):
        p = p.as_json()
    if not isinstance(p, dict):
        raise DescribeError(field, "expected Param(...) or a mapping, found %s" % kind(p))
    name = p.get("name")
    if not isinstance(name, str) or not name:
        raise DescribeError(field + ".name", "required, a non-empty string")
    field = "params[%d] (%s)" % (i, name)
    for key in p:
        if key not in ("name", "type", "required", "description", "default"):
            raise DescribeError(field, _unknown("field", key, ["name", "type", "required", "description", "default"]))
    ty = p.setdefault("type", "string")
    if not isinstance(ty, str) or not ty:
        raise DescribeError(field + ".type", "expected a string such as \"string\" or \"string|list\"")
    for part in ty.split("|"):
        if part not in _KINDS:
            raise DescribeError(field + ".type", _unknown("type", part, sorted(_KINDS)))
    if not isinstance(p.setdefault("required", False), bool):
        raise DescribeError(field + ".required", "expected true or false, found %s" % kind(p["required"]))
    if not isinstance(p.setdefault("description", ""), str):
        raise DescribeError(field + ".description", "expected a string, found %s" % kind(p["description"]))
    if p.get("default") is not None:
        err = type_error(name, ty, p["default"])
        if err:
            raise DescribeError(field + ".default", err)
    return p


def build(cls):
    """The describe document of a Plugin class; DescribeError names the field."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME.match(name):
        raise DescribeError("name", "required, a plugin name such as \"inventory\" (letters, digits, _ . -), found %r" % (name,))
    version = getattr(cls, "version", None)
    if not isinstance(version, str) or not _SEMVER.match(version):
        raise DescribeError("version", "%r is not a semantic version (e.g. \"1.2.0\")" % (version,))
    doc = (cls.__doc__ or "").strip().splitlines()
    description = getattr(cls, "description", None) or (doc[0] if doc else "")
    if not isinstance(description, str):
        raise DescribeError("description", "expected a string, found %s" % kind(description))
    idempotent = getattr(cls, "idempotent", False)
    if not isinstance(idempotent, bool):
        raise DescribeError("idempotent", "expected True or False, found %s" % kind(idempotent))
    mode = getattr(cls, "mode", "oneshot")
    if mode not in ("oneshot", "worker"):
        raise DescribeError("mode", "%r is not a mode (expected \"oneshot\" or \"worker\")" % (mode,))
    out = {"name": name, "version": version, "description": description, "idempotent": idempotent, "mode": mode}
    params = getattr(cls, "params", None)
    if params is not None:
        if not isinstance(params, (list, tuple)):
            raise DescribeError("params", "expected a list of Param(...), found %s" % kind(params))
        out["params"] = [_param(i, p) for i, p in enumerate(params)]
        seen = set()
        for p in out["params"]:
            if p["name"] in seen:
                raise DescribeError("params", "%r is declared twice" % p["name"])
            seen.add(p["name"])
    outputs = getattr(cls, "outputs", None)
    if outputs is not None:
        if not isinstance(outputs, (list, tuple)) or not all(isinstance(o, str) for o in outputs):
            raise DescribeError("outputs", "expected a list of field names (strings)")
        out["outputs"] = list(outputs)
    example = getattr(cls, "example_params", None)
    if example is not None:
        if not isinstance(example, dict):
            raise DescribeError("example_params", "expected a mapping, found %s" % kind(example))
        if params is not None:
            err = check(out["params"], dict(example), example)
            if err:
                raise DescribeError("example_params", err)
        out["example_params"] = example
    try:
        json.dumps(out)
    except (TypeError, ValueError) as e:
        raise DescribeError("describe", "not JSON: %s" % e) from None
    return out


def _unknown(what, name, known):
    close = difflib.get_close_matches(name, known, n=1)
    hint = "did you mean %s? " % json.dumps(close[0]) if close else ""
    return "unknown %s %s (%sexpected one of: %s)" % (what, json.dumps(name), hint, ", ".join(known))


def type_error(name, ty, value):
    """The error for `value` of param `name` declared `ty`, or None."""
    allowed = []
    for part in ty.split("|"):
        kinds = _KINDS[part]
        if kinds is None:
            return None
        allowed.append(part)
        if isinstance(value, bool) and bool not in kinds:
            continue
        if isinstance(value, kinds):
            if part == "char" and len(value) != 1:
                continue
            if part == "hex" and not re.match(r"^[0-9A-Fa-f]*$", value):
                continue
            return None
    expected = " or ".join(_NAMES[a] for a in allowed)
    found = kind(value)
    if isinstance(value, str) and found == "a string":
        found = "%s" % json.dumps(value)
    return "%s: expected %s, found %s" % (name, expected, found)


def check(declared, params, example=None):
    """Fills in defaults and checks `params` against the declared params, in
    the agent's words; returns the first error or None."""
    example = example or {}
    known = [p["name"] for p in declared]
    for key in params:
        if key not in known:
            return _unknown("parameter", key, known) if known else "unknown parameter %s (this plugin takes none)" % json.dumps(key)
    for p in declared:
        value = params.get(p["name"])
        if value is None:
            if p.get("default") is not None:
                params[p["name"]] = p["default"]
            elif p["required"]:
                e = example.get(p["name"])
                shown = e if isinstance(e, str) else (json.dumps(e) if e is not None else "...")
                return "%s: missing (e.g. %s: %s)" % (p["name"], p["name"], shown)
            continue
        err = type_error(p["name"], p["type"], value)
        if err:
            return err
    return None
