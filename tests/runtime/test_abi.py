"""The custom-call interface (xla_streams/runtime/abi.py) against the C++ that reads it,
and its attribute text written and read back. No library is built or loaded here.

The C++ side is read from the sources: the attributes ``DecodeAttrs`` (common.h) reads
for a start and, before ``if (!full) return``, for a done; those the compute probe's
binding reads; every attribute read anywhere in csrc/; the handler symbols; the kinds
and reductions it parses; the element types each backend dispatches on; the ABI
version and the timeout's default and range. A rename on either side fails here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import pytest

from xla_streams.runtime import abi, build

CSRC = build.source_dir()
CPP_TYPES = {"int64_t": "i64", "std::string_view": "string"}


def sources() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(CSRC.iterdir())}


def _block(text: str, opening: str) -> str:
    """The text from ``opening`` to the ``}`` that closes the first ``{`` after it."""
    begin = text.index(opening)
    depth = 0
    for at in range(text.index("{", begin), len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return text[begin : at + 1]
    raise AssertionError(f"no end to {opening!r}")


def dictionary_reads(code: str) -> dict[str, str]:
    """Attribute name -> type, of each ``Get<T>(attrs, "name", ...)`` and
    ``GetArray(attrs, "name")`` in ``code``."""
    found = {
        name: CPP_TYPES.get(cpp, cpp)
        for cpp, name in re.findall(r'\bGet<([\w:]+)>\(\s*attrs\s*,\s*"(\w+)"', code)
    }
    found.update({n: "array<i64>" for n in re.findall(r'\bGetArray\(\s*attrs\s*,\s*"(\w+)"', code)})
    return found


def binding_reads(code: str) -> dict[str, str]:
    """Attribute name -> type, of each ``.Attr<T>("name")`` of a handler binding."""
    return {
        name: CPP_TYPES.get(cpp, cpp)
        for cpp, name in re.findall(r'\.Attr<([\w:]+)>\(\s*"(\w+)"\s*\)', code)
    }


def every_read(code: str) -> set[str]:
    """Every attribute name the code looks up, however."""
    patterns = (
        r'\bGet(?:<[\w:]+>|Array)\(\s*attrs\s*,\s*"(\w+)"',
        r'\battrs\s*\.\s*(?:get<[^>]*>|contains)\(\s*"(\w+)"',
        r'\.Attr<[^>]*>\(\s*"(\w+)"',
    )
    return {name for pattern in patterns for name in re.findall(pattern, code)}


def _milliseconds(expression: str) -> int:
    """``int64_t{7} * 24 * 3600 * 1000`` -> its value."""
    value = 1
    for factor in expression.split("*"):
        value *= int(re.sub(r"^int64_t\{(\d+)\}$", r"\1", factor.strip()))
    return value


def drift(
    code: Mapping[str, str],
    start: Mapping[str, str] = abi.START_ATTRIBUTES,
    done: tuple[str, ...] = abi.DONE_ATTRIBUTES,
    compute: Mapping[str, str] = abi.COMPUTE_ATTRIBUTES,
    handlers: Mapping[str, Mapping[str, str]] = abi.HANDLERS,
) -> list[str]:
    """Where the C++ sources ``code`` (file name -> text) and the ABI disagree."""
    problems = []

    def compare(what: str, cpp: Mapping[str, str], ours: Mapping[str, str]) -> None:
        for name in sorted(set(cpp) | set(ours)):
            if name not in ours:
                problems.append(f"{what}: C++ reads '{name}', abi.py has no such attribute")
            elif name not in cpp:
                problems.append(f"{what}: abi.py has '{name}', C++ does not read it")
            elif cpp[name] != ours[name]:
                problems.append(f"{what}: '{name}' is {cpp[name]} in C++, {ours[name]} in abi.py")

    decode = _block(code["common.h"], "inline ffi::Error DecodeAttrs(")
    before_full = decode[: decode.index("if (!full) return")]
    compare("start (DecodeAttrs)", dictionary_reads(decode), start)
    compare(
        "done (DecodeAttrs, not full)", dictionary_reads(before_full), {n: start[n] for n in done}
    )
    probe = handlers["host"][abi.COMPUTE_TARGET]
    binding = re.search(
        rf"XLA_FFI_DEFINE_HANDLER_SYMBOL\(\s*{probe}\b.*?\);", code["host_backend.cc"], re.DOTALL
    )
    compare("compute probe", binding_reads(binding.group(0)) if binding else {}, compute)
    everywhere = set().union(*(every_read(text) for text in code.values()))
    for name in sorted(everywhere - set(start) - set(compute)):
        problems.append(f"csrc/ reads attribute '{name}', which abi.py does not define")
    for backend, targets in handlers.items():
        defined = re.findall(
            r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(\s*(\w+)", code[f"{backend}_backend.cc"]
        )
        if sorted(defined) != sorted(targets.values()):
            problems.append(f"{backend} handlers: C++ defines {sorted(defined)}, abi.py has "
                            f"{sorted(targets.values())}")  # fmt: skip
    return problems


def test_the_runtime_reads_exactly_the_attributes_abi_defines() -> None:
    assert drift(sources()) == []


@pytest.mark.parametrize("name", [*abi.START_ATTRIBUTES, *abi.COMPUTE_ATTRIBUTES])
def test_a_rename_on_either_side_is_found(name: str) -> None:
    """The check above is real: renaming one attribute in the C++ or in abi.py fails it."""
    code = sources()
    renamed = {file: re.sub(rf'"{name}"', f'"{name}_renamed"', text) for file, text in code.items()}
    assert drift(renamed) != []
    assert any(f"'{name}'" in p for p in drift(renamed))
    start = {(f"{n}_renamed" if n == name else n): t for n, t in abi.START_ATTRIBUTES.items()}
    compute = {(f"{n}_renamed" if n == name else n): t for n, t in abi.COMPUTE_ATTRIBUTES.items()}
    done = tuple(f"{n}_renamed" if n == name else n for n in abi.DONE_ATTRIBUTES)
    if name in abi.DONE_ATTRIBUTES:  # the done's must stay among the start's
        assert any(f"'{name}'" in p for p in drift(code, start=start, done=done))
    else:
        assert any(f"'{name}'" in p for p in drift(code, start=start, compute=compute))


def test_a_changed_type_or_symbol_is_found() -> None:
    code = sources()
    retyped = code["common.h"].replace(
        'Get<int64_t>(attrs, "dimension"', 'GetArray(attrs, "dimension"'
    )
    assert drift({**code, "common.h": retyped}) == [
        "start (DecodeAttrs): 'dimension' is array<i64> in C++, i64 in abi.py"
    ]
    handlers = {**abi.HANDLERS, "cuda": {abi.START_TARGET: "xla_streams_cuda_begin"}}
    assert any("cuda handlers" in p for p in drift(code, handlers=handlers))


def test_kinds_reductions_version_and_timeout_agree_with_the_runtime() -> None:
    code = sources()
    common = code["common.h"]
    parse_kind = _block(common, "inline bool ParseKind(")
    assert sorted(re.findall(r'== "([\w-]+)"', parse_kind)) == sorted(abi.FFI_KINDS)
    parse_reduction = _block(common, "inline bool ParseReduction(")
    assert sorted(re.findall(r'== "(\w+)"', parse_reduction)) == sorted(abi.REDUCTIONS)
    version = re.search(r"int xs_abi_version\(\) \{ return (\d+); \}", code["common_api.cc"])
    assert version is not None and int(version[1]) == abi.ABI_VERSION
    bounds = dict(re.findall(r"constexpr int64_t (k\w+TimeoutMs) = ([^;]+);", common))
    assert _milliseconds(bounds["kMinTimeoutMs"]) == round(abi.MIN_TIMEOUT_S * 1000)
    assert _milliseconds(bounds["kMaxTimeoutMs"]) == round(abi.MAX_TIMEOUT_S * 1000)
    default = re.search(r"std::atomic<int64_t> timeout_ms\{(\d+)\}", common)
    assert default is not None and int(default[1]) == round(abi.DEFAULT_TIMEOUT_S * 1000)


def test_element_types_are_those_each_backend_dispatches_on() -> None:
    """The host reduces (and so runs) the types of ``Reduce``'s switch; the CUDA backend
    those ``NcclType`` maps to an NCCL type."""
    code = sources()
    switches = {
        "host": _block(code["host_backend.cc"], "bool Reduce("),
        "cuda": _block(code["cuda_backend.cc"], "bool NcclType("),
    }
    for backend, switch in switches.items():
        cases = re.findall(r"case ffi::DataType::(\w+):", switch)
        assert sorted(c.lower() for c in cases) == sorted(abi.ELEMENT_TYPES[backend]), backend


# -- the attribute text ------------------------------------------------------------------

CALL = abi.CollectiveCall(
    op_id=3,
    name="ag-start",
    kind="all-gather",
    stream=1,
    groups=(0, 1, 2, 3),
    group_sizes=(2, 2),
    dimension=0,
    outer=(1,),
    channel=7,
    num_partitions=4,
)


def test_start_and_done_configs_as_lower_to_ffi_writes_them() -> None:
    assert CALL.start_config() == (
        '{op_id = 3 : i64, name = "ag-start", kind = "all-gather", stream = 1 : i64, '
        'reduction = "", groups = array<i64: 0, 1, 2, 3>, group_sizes = array<i64: 2, 2>, '
        "dimension = 0 : i64, outer = array<i64: 1>, channel = 7 : i64, num_partitions = 4 : i64}"
    )  # no device_ids: written only when set
    assert CALL.done_config() == (
        '{op_id = 3 : i64, name = "ag-start", kind = "all-gather", stream = 1 : i64}'
    )
    with_devices = dataclasses.replace(CALL, device_ids=(3, 2, 1, 0), outer=())
    assert with_devices.start_config().endswith(
        "outer = array<i64>, channel = 7 : i64, num_partitions = 4 : i64, "
        "device_ids = array<i64: 3, 2, 1, 0>}"
    )
    assert list(abi.START_ATTRIBUTES) == [f.name for f in dataclasses.fields(abi.CollectiveCall)]


def test_configs_read_back() -> None:
    with_devices = dataclasses.replace(CALL, device_ids=(3, 2, 1, 0), dimension=-1)
    for call in (CALL, with_devices):
        assert abi.CollectiveCall.parse(call.start_config()) == call
    assert abi.CollectiveCall.parse(CALL.done_config()) == abi.CollectiveCall(
        3, "ag-start", "all-gather", 1
    )
    assert abi.parse_attributes("{}") == {}
    assert abi.render_attributes({"a": -1, "b": "x", "c": (), "d": (-2, 5)}) == (
        '{a = -1 : i64, b = "x", c = array<i64>, d = array<i64: -2, 5>}'
    )
    assert abi.parse_attributes('{a = -1 : i64, b = "x", c = array<i64>, d = array<i64: -2, 5>}') == {
        "a": -1, "b": "x", "c": (), "d": (-2, 5)
    }  # fmt: skip


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("op_id = 1 : i64", "not an attribute dictionary"),
        ("{op_id = 1 : i32}", "cannot read attribute"),
        ("{op_id = 1 : i64} x", "text after the dictionary"),
        ("{op_id = 1 : i64, op_id = 2 : i64}", "given twice"),
        ('{op_id = 1 : i64, name = "n", kind = "all-reduce", stream = 0 : i64, x = 1 : i64}',
         "unknown attribute 'x'"),
        ('{op_id = 1 : i64, name = "n", kind = "all-reduce"}', "attribute 'stream' missing"),
        ('{op_id = "1", name = "n", kind = "all-reduce", stream = 0 : i64}',
         "attribute 'op_id' is not of type i64"),
    ],
)  # fmt: skip
def test_configs_that_are_not_ours_are_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        abi.CollectiveCall.parse(text)


def test_booleans_are_refused() -> None:
    with pytest.raises(TypeError, match="booleans are not used"):
        abi.render_attributes({"on": True})
