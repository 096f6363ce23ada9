"""The repositories WORKSPACE declares: all local, so that Bazel 4 builds offline."""

def _native_rules_impl(ctx):
    ctx.file("BUILD", "")
    ctx.file(ctx.attr.package + "/BUILD", "")
    ctx.file(ctx.attr.package + "/defs.bzl", "".join([
        "def {0}(**kwargs):\n    native.{0}(**kwargs)\n".format(rule)
        for rule in ctx.attr.rules
    ]))

# Bazel 4's own tools load `@rules_cc//cc:defs.bzl` and `@rules_java//java:defs.bzl`,
# which it would download; these stand-ins define the rules they load as the native ones.
native_rules = repository_rule(
    implementation = _native_rules_impl,
    attrs = {
        "package": attr.string(mandatory = True),
        "rules": attr.string_list(mandatory = True),
    },
)

def _coverage_tools_stub_impl(ctx):
    ctx.file("BUILD", "\n".join([
        'filegroup(name = "%s", visibility = ["//visibility:public"])' % name
        for name in ("coverage_report_generator", "lcov_merger")
    ]))

# Every test depends on the coverage tools, which Bazel 4 would download; the project
# collects no coverage through Bazel, so empty targets stand in.
coverage_tools_stub = repository_rule(implementation = _coverage_tools_stub_impl)

# What the project's own runtime build uses (xla_streams/runtime/build.py): the FFI
# headers of the installed jaxlib, the compiler flags and the host library's files.
_QUERY = """
import json
from xla_streams.runtime import build
host = build.LIBRARIES["host"]
print(json.dumps({
    "include": str(build.ffi_include_dir()),
    "flags": list(build.CXX_FLAGS),
    "host_files": list(host.sources + host.headers),
}))
"""

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "python3",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(name = "runtime_pair", py3_runtime = ":python3")

toolchain(
    name = "python_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)

cc_library(
    name = "ffi_headers",
    hdrs = glob(["ffi_include/xla/ffi/api/*.h"]),
    includes = ["ffi_include"],
    visibility = ["//visibility:public"],
)
"""

def _venv_impl(ctx):
    workspace = ctx.path(Label("@//:WORKSPACE")).dirname
    python = workspace.get_child(ctx.attr.path).get_child("bin").get_child("python")
    if not python.exists:
        fail("%s is missing: run `make` first (it makes the project's .venv)" % python)

    # Read, so that a new install (`make` touches the stamp) or a change to the runtime's
    # build fetches this repository again.
    ctx.read(Label("@//:%s/.installed" % ctx.attr.path))
    ctx.read(Label("@//:xla_streams/runtime/build.py"))
    result = ctx.execute([python, "-c", _QUERY], working_directory = str(workspace))
    if result.return_code != 0:
        fail("asking xla_streams.runtime.build failed:\n" + result.stderr)
    found = json.decode(result.stdout)
    ctx.symlink(found["include"], "ffi_include")
    ctx.file("BUILD", _BUILD.format(python = python))
    ctx.file("runtime.bzl", "\n".join([
        "# From xla_streams/runtime/build.py, by bazel/repositories.bzl.",
        "CXX_FLAGS = %r" % found["flags"],
        "HOST_FILES = %r" % found["host_files"],
        "",
    ]))

# The project's .venv (made by `make`): its interpreter is the Python toolchain, with
# jax, pytest and the rest installed, and its jaxlib's XLA FFI headers build the runtime.
venv = repository_rule(
    implementation = _venv_impl,
    attrs = {
        "path": attr.string(mandatory = True),
    },
)
