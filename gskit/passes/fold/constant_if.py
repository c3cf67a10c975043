"""gskit's own flattening of ``If`` nodes with a constant condition: the taken branch is inlined, and
outer-scope tensors and constants a branch returns stay intact (graphsurgeon's flattening rebinds them)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from gskit.passes.edit import unique_name
from gskit.plugin.ops import is_default_domain


def flatten_constant_ifs(graph: gs.Graph) -> int:
    """Inline the taken branch of each ``If`` with a constant condition; outer-scope tensors stay intact.
    Returns how many were inlined."""
    index = 0
    flattened = 0
    used_names: set[str] | None = None  # the graph's tensor names, once an If is flattened
    while index < len(graph.nodes):
        node = graph.nodes[index]
        if (
            node.op != "If"
            or not is_default_domain(node.domain)
            or not node.inputs
            or not isinstance(node.inputs[0], gs.Constant)
        ):
            index += 1
            continue
        cond = np.asarray(node.inputs[0].values)
        if cond.size != 1:
            index += 1
            continue
        branch = node.attrs.get("then_branch" if bool(cond.reshape(())) else "else_branch")
        if not isinstance(branch, gs.Graph) or len(branch.outputs) != len(node.outputs):
            index += 1  # a malformed If (a branch missing, outputs miscounted): left for the checker
            continue
        if used_names is None:
            used_names = set(graph.tensors())
        local = branch._local_tensors()
        for tensor in local.values():
            tensor.name = unique_name(f"{tensor.name}__{node.name or 'if'}", used_names)
        new_nodes = list(branch.nodes)
        branch_node_ids = {id(n) for n in new_nodes}
        local_ids = {id(t) for t in local.values()}
        pairs = list(zip(list(node.outputs), list(branch.outputs), strict=True))
        node.inputs.clear()
        node.outputs.clear()  # also detaches the If from each output's producers
        for node_out, branch_out in pairs:
            consumers = list(branch_out.outputs)
            movable = (
                id(branch_out) in local_ids
                and isinstance(branch_out, gs.Variable)
                and len(branch_out.inputs) == 1
                and all(id(c) in branch_node_ids for c in consumers)
            )
            if movable:  # the branch computes it: let its producer write the If's output directly
                producer = branch_out.inputs[0]
                for consumer in consumers:
                    for i, tensor in enumerate(consumer.inputs):
                        if tensor is branch_out:
                            consumer.inputs[i] = node_out
                producer.outputs[producer.outputs.index(branch_out)] = node_out
            else:  # an outer-scope tensor, a constant or a branch input: copy it through
                new_nodes.append(
                    gs.Node(
                        "Identity",
                        name=unique_name(f"{node_out.name}__if_out", used_names),
                        inputs=[branch_out],
                        outputs=[node_out],
                    )
                )
        graph.nodes[index : index + 1] = new_nodes
        index += len(new_nodes)
        flattened += 1
    return flattened
