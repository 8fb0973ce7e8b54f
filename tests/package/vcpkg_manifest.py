#!/usr/bin/env python3
"""Checks a port's vcpkg.json against vcpkg's manifest rules (vcpkg-tool's vcpkg.schema.json and
vcpkg's manifest documentation), and against the port's portfile and project:

    vcpkg_manifest.py <vcpkg.json> <portfile.cmake> <project CMakeLists.txt> <LICENSE>
    vcpkg_manifest.py --self-test     # each rule rejects a manifest that breaks it

Prints one line per problem and exits 1 when there is any.
"""
import json
import re
import sys

IDENTIFIER = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
PORT_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*(\.[a-z0-9]+(-[a-z0-9]+)*)*$")
RESERVED = re.compile(r"(^|\.)(prn|aux|nul|con|lpt[1-9]|com[1-9]|core|default)(\.|$)")
# Version schemes (vcpkg's manifest reference); a port has exactly one. Pre-release and build
# suffixes as semver.org defines them.
_PRE = r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
_BUILD = r"(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
_NUM = r"(?:0|[1-9]\d*)"
VERSION_PATTERNS = {
    "version": rf"^\d+(?:\.\d+)*{_PRE}{_BUILD}$",                   # relaxed: any number of parts
    "version-semver": rf"^{_NUM}\.{_NUM}\.{_NUM}{_PRE}{_BUILD}$",
    "version-date": r"^\d{4}-\d{2}-\d{2}(?:\.\d+)*$",                # 2024-01-31, optionally .1
    "version-string": r"^[^#]+$",                                     # anything without '#'
}
TOP_KEYS = {"name", "port-version", "maintainers", "summary", "description", "homepage", "documentation",
            "license", "builtin-baseline", "dependencies", "overrides", "features", "default-features",
            "supports", "vcpkg-configuration", *VERSION_PATTERNS}
ONLY_TOP_LEVEL = {"builtin-baseline", "overrides", "vcpkg-configuration"}  # no effect in a port
DEPENDENCY_KEYS = {"name", "features", "host", "default-features", "platform", "version>="}
FEATURE_KEYS = {"description", "dependencies", "supports", "license"}
# Platform expression identifiers vcpkg knows (triplet and target traits).
PLATFORM_IDS = {"windows", "uwp", "xbox", "linux", "osx", "ios", "android", "emscripten", "freebsd", "openbsd",
                "mingw", "x86", "x64", "arm", "arm32", "arm64", "arm64ec", "wasm32", "mips64", "ppc64le",
                "riscv32", "riscv64", "loongarch32", "loongarch64", "s390x", "static", "staticcrt", "native"}
SPDX_ID = r"[A-Za-z0-9][A-Za-z0-9.+-]*"
SPDX_EXPRESSION = re.compile(rf"^\(?{SPDX_ID}\)?( (AND|OR|WITH) \(?{SPDX_ID}\)?)*$")
# Helper ports a portfile's functions come from: vcpkg wants them as host dependencies.
HELPERS = {"vcpkg_cmake_configure": "vcpkg-cmake", "vcpkg_cmake_install": "vcpkg-cmake",
           "vcpkg_cmake_build": "vcpkg-cmake", "vcpkg_cmake_config_fixup": "vcpkg-cmake-config"}
# How a license expression names the license a LICENSE file's opening words state.
LICENSE_TEXTS = {"Apache-2.0": ("Apache License", "Version 2.0"), "MIT": ("MIT License",),
                 "BSL-1.0": ("Boost Software License",)}


def is_description(value):
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def check_platform(expr, where):
    if not isinstance(expr, str) or not expr.strip():
        return [f"{where}: a platform expression must be a non-empty string"]
    problems = []
    if not re.fullmatch(r"[a-z0-9!&|(), ]+", expr):
        problems.append(f"{where}: '{expr}' has characters a platform expression cannot have")
    depth = 0
    for c in expr:
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth < 0:
            break
    if depth != 0:
        problems.append(f"{where}: unbalanced parentheses in '{expr}'")
    for ident in re.findall(r"[a-z0-9]+", expr):
        if ident not in PLATFORM_IDS:
            problems.append(f"{where}: '{ident}' is not a platform vcpkg knows")
    return problems


def check_dependencies(deps, where):
    if not isinstance(deps, list):
        return [f"{where}: must be an array"]
    problems, names = [], []
    for i, dep in enumerate(deps):
        at = f"{where}[{i}]"
        if isinstance(dep, dict):
            for key in dep:
                if key not in DEPENDENCY_KEYS and not key.startswith("$"):
                    problems.append(f"{at}: unknown field '{key}'")
            name = dep.get("name")
            if name is None:
                problems.append(f"{at}: a dependency object needs 'name'")
                continue
            if "host" in dep and not isinstance(dep["host"], bool):
                problems.append(f"{at}: 'host' must be true or false")
            if "default-features" in dep and not isinstance(dep["default-features"], bool):
                problems.append(f"{at}: 'default-features' must be true or false")
            for feature in dep.get("features", []):
                if not (isinstance(feature, str) and IDENTIFIER.match(feature)) and not isinstance(feature, dict):
                    problems.append(f"{at}: feature '{feature}' is not an identifier")
            if "platform" in dep:
                problems += check_platform(dep["platform"], f"{at}.platform")
            if "version>=" in dep and not re.match(r"^[^#]+(#\d+)?$", str(dep["version>="])):
                problems.append(f"{at}: 'version>=' is not a version")
            if set(dep) <= {"name"}:
                problems.append(f"{at}: write a dependency with only a name as the string \"{name}\"")
        elif isinstance(dep, str):
            name = dep
        else:
            problems.append(f"{at}: a dependency is a port name or an object")
            continue
        if not isinstance(name, str) or not PORT_NAME.match(name) or RESERVED.search(name):
            problems.append(f"{at}: '{name}' is not a valid port name")
            continue
        names.append(name)
    if len(set(names)) != len(names):
        problems.append(f"{where}: a port is listed twice")
    if names != sorted(names):
        problems.append(f"{where}: not sorted by name, as vcpkg format-manifest writes them: {names}")
    return problems


def check_manifest(manifest, portfile="", project_version=None, license_text=None):
    """The problems of a port manifest (a parsed vcpkg.json), one sentence each."""
    if not isinstance(manifest, dict):
        return ["the manifest must be a JSON object"]
    problems = []
    for key in manifest:
        if key not in TOP_KEYS and not key.startswith("$"):
            problems.append(f"unknown field '{key}'")
        elif key in ONLY_TOP_LEVEL:
            problems.append(f"'{key}' has no effect in a port's manifest (only in a project's)")
    name = manifest.get("name")
    if not isinstance(name, str) or not IDENTIFIER.match(name) or RESERVED.search(name):
        problems.append(f"'name' must be a lowercase identifier (letters, digits, dashes), not {name!r}")
    schemes = [k for k in VERSION_PATTERNS if k in manifest]
    if len(schemes) != 1:
        problems.append(f"a port needs exactly one of {', '.join(VERSION_PATTERNS)}; it has {schemes or 'none'}")
    for scheme in schemes:
        value = manifest[scheme]
        if not isinstance(value, str) or not re.match(VERSION_PATTERNS[scheme], value):
            problems.append(f"'{scheme}' {value!r} does not match that scheme's pattern")
        elif project_version is not None and value != project_version:
            problems.append(f"'{scheme}' is {value} but CMakeLists.txt's project() says {project_version}")
    if "port-version" in manifest:
        pv = manifest["port-version"]
        if not isinstance(pv, int) or isinstance(pv, bool) or pv < 0:
            problems.append(f"'port-version' must be a non-negative integer, not {pv!r}")
    if "description" not in manifest or not is_description(manifest["description"]):
        problems.append("'description' (a string or an array of strings) is required for a port")
    for key in ("summary", "homepage", "documentation"):
        if key in manifest and not isinstance(manifest[key], str):
            problems.append(f"'{key}' must be a string")
    for key in ("homepage", "documentation"):
        if isinstance(manifest.get(key), str) and not re.match(r"^[a-z][a-z0-9+.-]*://", manifest[key]):
            problems.append(f"'{key}' must be a URI")
    lic = manifest.get("license")
    if lic is not None:
        if not isinstance(lic, str) or not SPDX_EXPRESSION.match(lic):
            problems.append(f"'license' must be an SPDX license expression (or null), not {lic!r}")
        elif license_text is not None:
            words = LICENSE_TEXTS.get(lic)
            head = " ".join(license_text.split()[:40])
            if words is None:
                problems.append(f"'license' {lic}: no known wording to compare LICENSE with")
            elif not all(w in head for w in words):
                problems.append(f"'license' says {lic} but LICENSE does not begin with {' '.join(words)!r}")
    if "supports" in manifest:
        problems += check_platform(manifest["supports"], "'supports'")
    deps = manifest.get("dependencies", [])
    problems += check_dependencies(deps, "'dependencies'")
    features = manifest.get("features", {})
    if not isinstance(features, dict):
        problems.append("'features' must be an object")
        features = {}
    for fname, feature in features.items():
        if not IDENTIFIER.match(fname) or RESERVED.search(fname):
            problems.append(f"feature '{fname}' is not a valid identifier")
        if not isinstance(feature, dict):
            problems.append(f"feature '{fname}' must be an object")
            continue
        for key in feature:
            if key not in FEATURE_KEYS and not key.startswith("$"):
                problems.append(f"feature '{fname}': unknown field '{key}'")
        if not is_description(feature.get("description")):
            problems.append(f"feature '{fname}': 'description' is required")
        problems += check_dependencies(feature.get("dependencies", []), f"feature '{fname}' dependencies")
    for fname in manifest.get("default-features", []):
        if (fname if isinstance(fname, str) else fname.get("name")) not in features:
            problems.append(f"'default-features' names '{fname}', which is not a feature")
    # The portfile's helper functions come from host dependencies.
    host = {d["name"] for d in deps if isinstance(d, dict) and d.get("host") is True}
    plain = {d if isinstance(d, str) else d.get("name") for d in deps if not (isinstance(d, dict) and d.get("host"))}
    for function, helper in HELPERS.items():
        if re.search(rf"^\s*{function}\s*\(", portfile, re.M) and helper not in host:
            where = "is a target dependency" if helper in plain else "is missing"
            problems.append(f"the portfile calls {function}(): {{\"name\": \"{helper}\", \"host\": true}} {where}")
    return problems


def self_test():
    good = {"name": "cohort", "version": "0.1.0", "description": "d", "license": "Apache-2.0",
            "supports": "!windows", "dependencies": ["nlohmann-json", {"name": "vcpkg-cmake", "host": True}]}
    portfile = "vcpkg_cmake_configure(SOURCE_PATH x)\n"
    apache = "                                 Apache License\n                           Version 2.0, January 2004"
    assert check_manifest(good, portfile, "0.1.0", apache) == [], check_manifest(good, portfile, "0.1.0", apache)
    bad = {  # what each breaks: a rule above must name it
        "name": {"name": "Cohort"}, "reserved name": {"name": "core"},
        "no version": {"version": None}, "two versions": {"version-string": "x"},
        "version pattern": {"version": "0.1.0#1"}, "project version": {"version": "0.2.0"},
        "port-version": {"port-version": -1}, "description": {"description": 3},
        "license": {"license": "Apache 2"}, "license text": {"license": "MIT"},
        "supports": {"supports": "windoze"}, "unknown field": {"homepag": "x"},
        "top-level only": {"builtin-baseline": "0" * 40},
        "dependency name": {"dependencies": ["Range_v3"]},
        "dependency field": {"dependencies": [{"name": "zlib", "hots": True}]},
        "host not bool": {"dependencies": [{"name": "vcpkg-cmake", "host": "yes"}]},
        "helper not host": {"dependencies": ["vcpkg-cmake"]},
        "helper missing": {"dependencies": ["zlib"]},
        "unsorted": {"dependencies": ["zlib", {"name": "vcpkg-cmake", "host": True}]},
        "duplicate": {"dependencies": ["zlib", "zlib", {"name": "vcpkg-cmake", "host": True}]},
        "feature description": {"features": {"mpi": {"dependencies": ["mpi"]}}},
        "default feature": {"default-features": ["torch"]},
    }
    failures = []
    for what, change in bad.items():
        manifest = {k: v for k, v in {**good, **change}.items() if v is not None}
        if not check_manifest(manifest, portfile, "0.1.0", apache):
            failures.append(what)
    for what in failures:
        print(f"self-test: a manifest with a bad {what} passed")
    print(f"self-test: {len(bad) - len(failures)} of {len(bad)} bad manifests rejected")
    return 1 if failures else 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 5:
        print("usage: vcpkg_manifest.py <vcpkg.json> <portfile.cmake> <CMakeLists.txt> <LICENSE> | --self-test",
              file=sys.stderr)
        return 2
    path, portfile, cmakelists, license_file = argv[1:]
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{path}: {e}")
        return 1
    with open(portfile, encoding="utf-8") as f:
        port = f.read()
    with open(cmakelists, encoding="utf-8") as f:
        match = re.search(r"project\(\s*\S+\s+VERSION\s+([0-9.]+)", f.read())
    with open(license_file, encoding="utf-8") as f:
        license_text = f.read()
    problems = check_manifest(manifest, port, match.group(1) if match else None, license_text)
    for p in problems:
        print(f"{path}: {p}")
    if not problems:
        print(f"{path}: follows vcpkg's manifest rules ({manifest['name']} {manifest.get('version')})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
