"""Pattern matching and replacement by plugin nodes.

Plugin authors write rules in ``plugins/<name>/patterns.py``; ``replace`` applies them to a graph.
"""

from gskit.passes.patterns.derived import DerivedPattern, RuleDescription
from gskit.passes.patterns.dsl import ATTRIBUTE_INPUTS, COMMUTATIVE, OpBuilder, PatternGraph, trace
from gskit.passes.patterns.match import GraphIndex, MatchResult, Tracer, constant_value
from gskit.passes.patterns.replace import (
    Explanation,
    PluginReport,
    ReplacedRegion,
    ReplaceReport,
    RuleReport,
    Skip,
    replace,
)
from gskit.passes.patterns.rules import FunctionPattern, GraphPattern, Match, OpPattern, Rewrite, Rule

__all__ = [
    # rules
    "GraphPattern",
    "OpPattern",
    "FunctionPattern",
    "Rule",
    "Match",
    "MatchResult",
    "Rewrite",
    # replacement
    "replace",
    "ReplaceReport",
    "PluginReport",
    "ReplacedRegion",
    "Skip",
    "Explanation",
    "RuleReport",
    # rules derived from exported graphs (gskit.plugin.from_torch)
    "DerivedPattern",
    "RuleDescription",
    # pattern language internals
    "OpBuilder",
    "PatternGraph",
    "trace",
    "GraphIndex",
    "Tracer",
    "constant_value",
    "ATTRIBUTE_INPUTS",
    "COMMUTATIVE",
]
