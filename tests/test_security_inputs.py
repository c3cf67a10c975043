"""Safe by default (issue 15), the input side: crafted or tiny-but-hostile inputs never run code, never hang
or exhaust memory, never pass a wrong model, and end in one line naming what is wrong (exit 2), not a
traceback. Every model is built here; the CLI runs in-process (``gskit.cli.main``) unless a real process is
the point (exit codes and stderr of the interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import parse_model
from onnx import TensorProto, helper, numpy_helper

from gskit.cli import main
from gskit.errors import GskitError
from gskit.io import model as gsmodel

REPO = Path(__file__).resolve().parents[1]


def gskit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run ``gskit ARGV`` in-process; the exit code and stderr."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def one_line_error(code: int, err: str, *words: str) -> None:
    """Exit 2 with one ``gskit ...: error:`` line that mentions ``words``; no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], err


def gskit_process(*argv: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m gskit.cli ARGV`` as a separate process (real exit code and stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "gskit.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


TANH = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 4] y) {
    y = Tanh(x)
}
"""
SIGMOID = TANH.replace("Tanh", "Sigmoid")
NAN_OUT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 4] y) {
    zero = Constant<value = float {0.0}>()
    z = Div(zero, zero)
    t = Tanh(x)
    y = Add(t, z)
}
"""


def save(tmp_path: Path, text_or_model: str | onnx.ModelProto, name: str) -> Path:
    model = parse_model(text_or_model) if isinstance(text_or_model, str) else text_or_model
    path = tmp_path / name
    onnx.save(model, path)
    return path


# ---- 5. plugin new --from-node: values read from a model never become code --------------------------------


def _custom_node_model(node: onnx.NodeProto) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(node.domain, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _plugin_new_then_list(capsys, tmp_path: Path, model: onnx.ModelProto, node: str) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    plugins = tmp_path / "p"
    code, err = gskit(capsys, "plugin", "new", "crafted", "--dir", plugins, "--from-node", f"{path}:{node}")
    assert code == 0, err
    code, err = gskit(capsys, "plugin", "list", "--plugins", plugins, "--json")
    assert code == 0, err
    return plugins / "crafted"


def test_plugin_new_from_a_crafted_node_name_writes_no_code(tmp_path, capsys) -> None:
    marker = tmp_path / "MARKER"
    # Ends the string literal of an attribute's doc on the code as it was: doc="from node 'NAME'".
    name = f'x\'" + str(open({str(marker)!r}, "w")) + "'
    node = helper.make_node("Crafted", ["x"], ["y"], name=name, domain="test.dom", alpha=1.0)
    model = _custom_node_model(node)
    folder = _plugin_new_then_list(capsys, tmp_path, model, name)
    assert not marker.exists()
    from gskit.plugin import load_spec_file

    (spec,) = load_spec_file(folder / "spec.py")
    assert not marker.exists()
    assert (spec.name, spec.namespace) == ("Crafted", "test.dom")
    assert spec.attributes[0].doc == f"from node '{name}'"


def test_plugin_new_keeps_crafted_attributes_as_exact_strings(tmp_path, capsys) -> None:
    marker = tmp_path / "MARKER"
    attrs = {
        'a"); open("m", "w")#': "v",
        "label": f"'''\"\"\"\\\n open({str(marker)!r}, 'w') é",
        "scale": float("nan"),
        "limits": [1.0, float("inf")],
        "names": ['q"', "\\n"],
    }
    node = helper.make_node('Op"#', ["x"], ["y"], name='n"', domain='test.dom"ain', **attrs)
    folder = _plugin_new_then_list(capsys, tmp_path, _custom_node_model(node), 'n"')
    from gskit.plugin import load_spec_file

    (spec,) = load_spec_file(folder / "spec.py")
    assert not marker.exists()
    assert (spec.name, spec.namespace) == ('Op"#', 'test.dom"ain')
    loaded = {a.name: a.default for a in spec.attributes}
    assert set(loaded) == set(attrs)
    assert loaded["label"] == attrs["label"]
    assert loaded['a"); open("m", "w")#'] == "v"
    assert np.isnan(loaded["scale"])
    assert loaded["limits"] == [1.0, float("inf")]
    assert loaded["names"] == ['q"', "\\n"]
    assert all(a.doc == "from node 'n\"'" for a in spec.attributes)
    # The reference (imported by the spec) takes the attribute that is no identifier through **attrs.
    inputs = [np.zeros((2, 3), np.float32)]
    with pytest.raises(NotImplementedError, match='Op"#'):
        spec.run_reference(inputs, {a.name: a.default for a in spec.attributes})


# ---- 6. tolerances: NaN, inf and negative are refused; NaN outputs never pass ------------------------------


@pytest.mark.parametrize(
    "flag,value", [("--atol", "nan"), ("--rtol", "nan"), ("--atol", "inf"), ("--rtol", "-1")]
)
def test_compare_refuses_a_non_finite_or_negative_tolerance(tmp_path, capsys, flag, value) -> None:
    original, wrong = save(tmp_path, TANH, "a.onnx"), save(tmp_path, SIGMOID, "b.onnx")
    code, err = gskit(capsys, "compare", original, wrong, flag, value)
    one_line_error(code, err, flag.lstrip("-"), value)


def test_recipe_refuses_a_nan_tolerance_with_its_line(tmp_path, capsys) -> None:
    original = save(tmp_path, TANH, "a.onnx")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - sanitize\n  - validate: {atol: .nan}\n")
    code, err = gskit(capsys, "prepare", original, "-o", tmp_path / "out", "--recipe", recipe)
    one_line_error(code, err, "r.yaml:3", "atol")
    assert not (tmp_path / "out").exists()


def test_library_refuses_a_nan_tolerance(tmp_path) -> None:
    from gskit.compare.outputs import compare, compare_arrays

    original, wrong = save(tmp_path, TANH, "a.onnx"), save(tmp_path, SIGMOID, "b.onnx")
    with pytest.raises(GskitError, match="atol"):
        compare(original, wrong, atol=float("nan"))
    with pytest.raises(GskitError, match="rtol"):
        compare_arrays({"y": np.zeros(2)}, {"y": np.ones(2)}, ["y"], rtol=float("nan"))


def test_a_nan_output_fails_whatever_the_tolerance(tmp_path, capsys) -> None:
    from gskit.compare.outputs import compare_arrays

    original, nan_model = save(tmp_path, TANH, "a.onnx"), save(tmp_path, NAN_OUT, "b.onnx")
    code, _ = gskit(capsys, "compare", original, nan_model, "--atol", "1e30", "--rtol", "1e30")
    assert code == 1
    (row,) = compare_arrays({"y": np.ones(3)}, {"y": np.array([1.0, np.nan, 1.0])}, ["y"], atol=1e30)
    assert not row.passed
    (row,) = compare_arrays({"y": np.array([1.0, np.nan])}, {"y": np.ones(2)}, ["y"], atol=1e30, rtol=1e30)
    assert not row.passed


# ---- 8. denial of service from tiny inputs --------------------------------------------------------------

# 2**26 floats (256 MiB) computed to be summed into one number: a ~300-byte model.
HUGE_INTERMEDIATES = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x) => (float[2] y, float a, float b, float c) {
    big = Constant<value = int64[1] {67108864}>()
    half = Constant<value = int64[1] {33554432}>()
    two = Constant<value = int64[1] {2}>()
    dims = Mul(half, two)
    z = ConstantOfShape<value = float[1] {1.0}>(dims)
    a = ReduceSum<keepdims = 0>(z)
    one = Constant<value = float[1] {1.0}>()
    e = Expand(one, big)
    b = ReduceSum<keepdims = 0>(e)
    t = Tile(one, big)
    c = ReduceSum<keepdims = 0>(t)
    two1 = Constant<value = int64[1] {2}>()
    s2 = ConstantOfShape<value = float[1] {0.5}>(two1)
    y = Add(x, s2)
}
"""


def test_fold_does_not_evaluate_huge_intermediates(tmp_path, capsys) -> None:
    from gskit.passes.fold import fold

    model = parse_model(HUGE_INTERMEDIATES)
    folded, report = fold(model, size_threshold=16 * 2**20)
    ops = [n.op_type for n in folded.graph.node]
    assert ops.count("ReduceSum") == 3
    assert {"ConstantOfShape", "Expand", "Tile"} <= set(ops)
    reasons = " ".join(report.excluded.values())
    assert "268435456 bytes, over size_threshold" in reasons
    # the CLI says which nodes it skipped, and exits 0
    path = save(tmp_path, HUGE_INTERMEDIATES, "tiny.onnx")
    capsys.readouterr()
    assert main(["fold", str(path), "-o", str(tmp_path / "out.onnx"), "--json"]) == 0
    assert "over size_threshold" in " ".join(json.loads(capsys.readouterr().out)["excluded"].values())


BILLION_LAUGHS = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]
steps:
  - validate: {shapes: {x: *i}}
"""


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "case,content,words",
    [
        ("aliases", BILLION_LAUGHS, ("more than",)),
        ("nesting", "steps:\n  - " + "[" * 5000 + "]" * 5000 + "\n", ("nested",)),
        ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", ("not a YAML recipe",)),
        ("oversized", "steps:\n  - sanitize\n" + "#" * (2 << 20) + "\n", ("larger than",)),
    ],
)
def test_hostile_recipes_end_in_one_line(tmp_path, capsys, case, content, words) -> None:
    model = save(tmp_path, TANH, "m.onnx")
    recipe = tmp_path / f"{case}.yaml"
    recipe.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, err = gskit(capsys, "prepare", model, "-o", tmp_path / "out", "--recipe", recipe)
    one_line_error(code, err, *words)


@pytest.mark.timeout(20)
def test_a_device_or_pipe_as_recipe_is_refused_not_read_forever(tmp_path, capsys) -> None:
    model = save(tmp_path, TANH, "m.onnx")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for recipe in ("/dev/zero", fifo, tmp_path):
        code, err = gskit(capsys, "prepare", model, "-o", tmp_path / "out", "--recipe", recipe)
        one_line_error(code, err, "regular file")


def _zip_bomb(path: Path, nbytes: int, written: int | None = None) -> Path:
    """An .npz whose one float32 array declares ``nbytes``; ``written`` bytes of zeros follow (all: None)."""
    import zipfile

    header = {"descr": "<f4", "fortran_order": False, "shape": (nbytes // 4,)}
    left = nbytes if written is None else written
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            while left > 0:
                member.write(bytes(min(left, 2**24)))
                left -= 2**24
    return path


def test_an_npz_that_unpacks_to_gigabytes_is_refused_from_its_headers(tmp_path, capsys) -> None:
    from gskit.io.feeds import load_feeds

    bomb = _zip_bomb(tmp_path / "bomb.npz", 2**27)  # 128 MiB of zeros in ~130 KB
    assert bomb.stat().st_size < 2**20
    with pytest.raises(GskitError, match="134217728 bytes once loaded, over the limit of 67108864"):
        load_feeds(bomb, max_bytes=2**26)
    # 2 GiB declared: refused from the header, before a byte of data is read
    lying = _zip_bomb(tmp_path / "lying.npz", 2**31, written=16)
    original = save(tmp_path, TANH, "a.onnx")
    code, err = gskit(capsys, "compare", original, original, "--inputs", lying)
    one_line_error(code, err, "lying.npz", "2147483648 bytes", "over the limit")


def test_an_npz_of_objects_is_refused_and_pickles_are_never_suggested(tmp_path, capsys) -> None:
    original = save(tmp_path, TANH, "a.onnx")
    objects = tmp_path / "objects.npz"
    np.savez(objects, x=np.array([{"a": 1}, None], dtype=object))
    code, err = gskit(capsys, "compare", original, original, "--inputs", objects)
    one_line_error(code, err, "objects.npz", "Python objects")
    assert "allow_pickle" not in err
    # 11. a file that is no archive is called that, not "pickled data"
    text = tmp_path / "inputs.txt"
    text.write_text("x = 1, 2, 3\n")
    code, err = gskit(capsys, "compare", original, original, "--inputs", text)
    one_line_error(code, err, "inputs.txt", "not an .npz archive")
    assert "pickle" not in err


def test_huge_input_dims_are_refused_before_allocating(tmp_path, capsys) -> None:
    huge = TANH.replace("[2, 4]", "[1000000000, 4]")
    model = save(tmp_path, huge, "huge.onnx")
    code, err = gskit(capsys, "compare", model, model)
    one_line_error(code, err, "'x'", "--shape")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - validate\n")
    code, err = gskit(capsys, "prepare", model, "-o", tmp_path / "out", "--recipe", recipe)
    one_line_error(code, err, "'x'", "over the")


# ---- 11. messages say what is wrong -----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "fold", "infer-shapes"])
def test_a_folder_given_as_the_model_is_called_a_folder(tmp_path, capsys, command) -> None:
    folder = tmp_path / "model.onnx"
    folder.mkdir()
    argv = [command, folder] + ([] if command == "inspect" else ["-o", tmp_path / "out.onnx"])
    code, err = gskit(capsys, *argv)
    one_line_error(code, err, "is a folder", "give the file itself")
    assert "no such" not in err


def test_an_op_of_an_unknown_domain_is_not_called_a_plugin_node(tmp_path, capsys) -> None:
    node = helper.make_node("Mystery", ["x"], ["y"], name="m", domain="com.unknown")
    path = tmp_path / "unknown.onnx"
    onnx.save(_custom_node_model(node), path)
    capsys.readouterr()
    main(["check-trt", str(path), "--json"])
    (issue,) = json.loads(capsys.readouterr().out)["issues"]
    assert "unknown domain 'com.unknown'" in issue["reason"]
    assert "neither an ONNX op nor a loaded plugin" in issue["reason"]


# ---- 9. user errors end in one line (exit 2), never a traceback --------------------------------------------


def _graph_model(nodes, initializers=(), outputs=None, functions=(), domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=list(initializers),
    )
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions))


def _bad_utf8_name() -> bytes:
    model = _graph_model([helper.make_node("Relu", ["x"], ["y"], name="relu")])
    return model.SerializeToString().replace(b"relu", b"r\xffl\xfe")


def _bad_utf8_producer() -> bytes:
    model = _graph_model([helper.make_node("Relu", ["x"], ["y"])])
    model.producer_name = "PRODX"
    return model.SerializeToString().replace(b"PRODX", b"P\xff\xfeDX")


def _unknown_dtype() -> bytes:
    weight = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    weight.data_type = 99
    return _graph_model([helper.make_node("Add", ["x", "w"], ["y"])], [weight]).SerializeToString()


def _self_loop() -> bytes:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Add", ["x", "z"], ["z"], name="loop")]
    return _graph_model(nodes).SerializeToString()


def _cycle() -> bytes:
    nodes = [
        helper.make_node("Add", ["x", "b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    return _graph_model(nodes).SerializeToString()


def _recursive_function() -> bytes:
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    call = helper.make_node("F", ["a"], ["b"], domain="local")
    function = helper.make_function("local", "F", ["a"], ["b"], [call], opsets)
    nodes = [helper.make_node("F", ["x"], ["y"], domain="local")]
    return _graph_model(nodes, functions=[function], domains=["local"]).SerializeToString()


def _bad_utf8_attribute() -> bytes:
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT, name="cast")
    node.attribute.append(helper.make_attribute("note", "TEXT"))
    return _graph_model([node]).SerializeToString().replace(b"TEXT", b"\xc4XYZ")


def _undefined_tensor_type() -> bytes:
    value = numpy_helper.from_array(np.ones((2, 3), np.float32))
    value.data_type = TensorProto.UNDEFINED
    return _graph_model([helper.make_node("Constant", [], ["y"], value=value)]).SerializeToString()


def _attribute_without_value() -> bytes:
    node = helper.make_node("Constant", [], ["y"], name="const")
    node.attribute.append(onnx.AttributeProto(name="value", type=onnx.AttributeProto.TENSOR, strings=[b"a"]))
    return _graph_model([node]).SerializeToString()


def _typed_value_info(build_type) -> bytes:
    model = _graph_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])])
    info = model.graph.value_info.add(name="r")
    build_type(info.type)
    return model.SerializeToString()


def _sequence_of_undefined() -> bytes:
    return _typed_value_info(lambda t: t.sequence_type.elem_type.tensor_type.SetInParent())


def _sequence_without_element() -> bytes:
    return _typed_value_info(lambda t: t.sequence_type.SetInParent())


MALFORMED = {
    "attribute_without_value": (_attribute_without_value, "(attribute 'value') is of kind TENSOR but holds"),
    "sequence_of_undefined": (_sequence_of_undefined, "value_info 'r' has a sequence, optional or map of"),
    "sequence_without_element": (_sequence_without_element, "'r' has a sequence, optional or map type"),
    "bad_utf8_attribute": (_bad_utf8_attribute, "attribute[1].s is not valid UTF-8"),
    "undefined_tensor_type": (_undefined_tensor_type, "element type 0, which a tensor cannot have"),
    "bad_utf8_name": (_bad_utf8_name, "node[0].name is not valid UTF-8"),
    "bad_utf8_producer": (_bad_utf8_producer, "producer_name is not valid UTF-8"),
    "unknown_dtype": (_unknown_dtype, "element type 99"),
    "self_loop": (_self_loop, "cycle through node 'loop'"),
    "cycle": (_cycle, "has a cycle through node"),
    "recursive_function": (_recursive_function, "local::F calls itself"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("command", ["inspect", "fold"])
def test_malformed_models_end_in_one_line(tmp_path, capsys, case, command) -> None:
    build, words = MALFORMED[case]
    path = tmp_path / f"{case}.onnx"
    path.write_bytes(build())
    argv = [command, path] + ([] if command == "inspect" else ["-o", tmp_path / "out.onnx"])
    code, err = gskit(capsys, *argv)
    one_line_error(code, err, f"{case}.onnx", words)


def test_string_initializers_are_kept_by_fold_and_validated(tmp_path, capsys) -> None:
    strings = helper.make_tensor("s", TensorProto.STRING, [2], [b"a", b"b"])
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
        helper.make_tensor_value_info("s2", TensorProto.STRING, [2]),
    ]
    nodes = [helper.make_node("Identity", ["s"], ["s2"]), helper.make_node("Relu", ["x"], ["y"])]
    path = tmp_path / "strings.onnx"
    onnx.save(_graph_model(nodes, [strings], outputs), path)
    code, err = gskit(capsys, "fold", path, "-o", tmp_path / "folded.onnx")
    assert code == 0, err
    code, err = gskit(capsys, "prepare", path, "-o", tmp_path / "out")
    assert code == 0, err


def test_an_onnxruntime_failure_in_compare_is_one_line(tmp_path, capsys) -> None:
    weight = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")

    def conv(kernel: int) -> onnx.ModelProto:
        node = helper.make_node(
            "Conv", ["x", "w"], ["y"], kernel_shape=[kernel] * 2, pads=[1] * 4, name="conv"
        )
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
            initializer=[weight],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    good, bad = save(tmp_path, conv(3), "good.onnx"), save(tmp_path, conv(5), "bad.onnx")
    code, err = gskit(capsys, "compare", good, bad)
    one_line_error(code, err, "kernel_shape")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - edit: {set_attrs: {conv: {kernel_shape: [5, 5]}}}\n  - validate\n")
    code, err = gskit(capsys, "prepare", good, "-o", tmp_path / "out", "--recipe", recipe)
    one_line_error(code, err, "validate", "kernel_shape")


def test_a_negative_seed_is_one_line(tmp_path, capsys) -> None:
    model = save(tmp_path, TANH, "a.onnx")
    code, err = gskit(capsys, "compare", model, model, "--seed", "-1")
    one_line_error(code, err, "seed", "-1")


def _limited_file_size() -> None:
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


def test_a_full_disk_names_the_file_and_why(tmp_path) -> None:
    model = save(tmp_path, TANH, "a.onnx")
    out = tmp_path / "out" / "folded.onnx"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "gskit.cli", "fold", str(model), "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=_limited_file_size,
        timeout=60,
    )
    one_line_error(done.returncode, done.stderr, f"cannot write {out}", "file-size limit")
    assert not out.exists()
    assert not [p for p in out.parent.iterdir()]  # the temporary folder is gone too


def test_no_space_left_is_said_in_plain_words() -> None:
    import errno

    from gskit.errors import describe_os_error

    with pytest.raises(OSError) as caught:  # /dev/full: every write fails with ENOSPC, for real
        with open("/dev/full", "wb", buffering=0) as full:
            full.write(b"x")
    assert caught.value.errno == errno.ENOSPC
    assert describe_os_error(caught.value, "out/model.onnx") == (
        "out/model.onnx: no space left on the disk; free some space or choose another output folder"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_folder_is_one_line(tmp_path, capsys) -> None:
    model = save(tmp_path, TANH, "a.onnx")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code, err = gskit(capsys, "fold", model, "-o", folder / "out.onnx")
    finally:
        folder.chmod(0o755)
    one_line_error(code, err, "out.onnx", "permission denied")


#: A real SIGINT while ``main`` imports its subcommands: sent by the process to itself at the first import
#: statement a subcommand module runs, so the test does not depend on how long the imports take.
_INTERRUPT_IN_START_UP = """
import builtins, os, signal, sys
from gskit.cli import main
real_import = builtins.__import__
def interrupting_import(name, globals=None, *args, **kwargs):
    if (globals or {}).get("__name__", "").startswith("gskit.cli."):
        builtins.__import__ = real_import
        os.kill(os.getpid(), signal.SIGINT)
    return real_import(name, globals, *args, **kwargs)
builtins.__import__ = interrupting_import
sys.exit(main())
"""


def test_ctrl_c_during_start_up_is_one_line(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_IN_START_UP, "inspect", "x.onnx"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["gskit: interrupted"]


def test_ctrl_c_while_the_parser_is_built_is_one_line(capsys, monkeypatch) -> None:
    import gskit.cli as cli

    def interrupted(words=None) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    code, err = gskit(capsys, "inspect", "x.onnx")
    assert code == 130
    assert err == "gskit: interrupted\n"


def test_fold_writes_nothing_into_the_working_folder(tmp_path, capsys, monkeypatch) -> None:
    """onnxruntime's symbolic shape inference saves ``sym_shape_infer_temp.onnx`` in the working folder
    when it gives up (here on an op it does not know, before a Shape): gskit runs it elsewhere."""
    nodes = [
        helper.make_node("elu", ["x"], ["r"], name="unknown"),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["z"]),
        helper.make_node("Add", ["r", "z"], ["y"]),
    ]
    model = tmp_path / "in" / "m.onnx"
    model.parent.mkdir()
    onnx.save(_graph_model(nodes), model)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    gskit(capsys, "fold", model, "-o", tmp_path / "out" / "folded.onnx")
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in model.parent.iterdir()) == ["m.onnx"]


def test_fold_leaves_an_if_without_condition_to_the_checker(tmp_path, capsys) -> None:
    branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t"])],
        "b",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    node = helper.make_node("If", [], ["y"], then_branch=branch, else_branch=branch, name="if")
    path = tmp_path / "if.onnx"
    path.write_bytes(_graph_model([node]).SerializeToString())
    code, err = gskit(capsys, "fold", path, "-o", tmp_path / "out.onnx")
    one_line_error(code, err, "If", "input size 0")


def test_a_file_rewritten_after_a_load_is_checked_again(tmp_path) -> None:
    """load() remembers files it found well-formed (compare loads one model four times); a file written again
    in place, even with the same size, is a new file to it."""
    path = tmp_path / "m.onnx"
    good = _graph_model(
        [helper.make_node("Relu", ["x"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["y"])]
    )
    path.write_bytes(good.SerializeToString())
    gsmodel.load(path)
    gsmodel.load(path, load_weights=False)
    bad = _cycle()
    with open(path, "r+b") as f:  # same inode: only the size and the time tell
        f.write(bad)
        f.truncate()
    with pytest.raises(GskitError, match="has a cycle through node"):
        gsmodel.load(path)
