"""The llama family's vocabulary lives in one room, ``registry/families/llama.py`` (issue 27).

Tensor names (Hugging Face ``model.layers.<l>.self_attn.q_proj``, GGUF ``blk.<l>.attn_q``), operator
slots, split-rule operators and parameter keys (config.json ``num_attention_heads``, GGUF
``attention.head_count``) appear as code literals nowhere else in the product packages: every user
imports the room. Docstrings and comments may name them (they document); string constants that code
uses may not. The room's own tables are checked against the names the runtime graph and the registry
derive from them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from shardport.registry.families import llama

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("registry", "loader", "placement", "provenance", "kernels", "deploy", "src/shardport")
ROOM = "registry/families/llama.py"

_WORDS = (
    # Hugging Face tensor names and slots
    r"[a-z_]*_proj",
    r"self_attn",
    r"[a-z_]*layernorm",
    r"block_sparse_moe",
    r"embed_tokens",
    r"lm_head",
    r"model\.layers",
    r"model\.norm",
    # GGUF tensor names
    r"blk\.",
    r"attn_(?:q|k|v|qkv|output|norm)",
    r"ffn_[a-z_]+",
    r"token_embd",
    r"output_norm",
    r"output\.weight",
    r"rope_freqs",
    # parameter keys (config.json, GGUF metadata)
    r"num_hidden_layers",
    r"num_attention_heads",
    r"num_key_value_heads",
    r"hidden_size",
    r"intermediate_size",
    r"num_local_experts",
    r"num_experts_per_tok",
    r"tie_word_embeddings",
    r"rms_norm_eps",
    r"rope_theta",
    r"max_position_embeddings",
    r"block_count",
    r"embedding_length",
    r"feed_forward_length",
    r"head_count(?:_kv)?",
    r"expert_(?:count|used_count)",
    r"layer_norm_rms_epsilon",
    r"freq_base",
    r"context_length",
    r"general\.architecture",
    r"rope_type",
    r"original_max_position_embeddings",
    r"[A-Za-z0-9]+ForCausalLM",
)
VOCABULARY = re.compile(r"(?<![A-Za-z0-9_])(?:" + "|".join(_WORDS) + r")")
EXACT = frozenset({"w1", "w2", "w3", "output", "norm"})
"""Literals that are vocabulary only as a whole string (Mixtral's experts, GGUF's head and norm)."""

# path -> literals allowed there, with the reason. Keep short; a stale entry fails the test.
ALLOWED: dict[str, set[str]] = {
    # the demo writes a user's checkpoint: its config.json names its architecture as any checkpoint does
    "deploy/demo.py": {"LlamaForCausalLM"},
}


def _docstrings(tree: ast.Module) -> set[int]:
    """``id`` of every docstring node (module, class, function)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
        # attribute docstrings: a bare string right after an assignment
        for child_list in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if not isinstance(child_list, list):
                continue
            for stmt in child_list:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    out.add(id(stmt.value))
    return out


def vocabulary_literals(source: str, name: str = "<source>") -> Iterator[tuple[int, str]]:
    """``(line, literal)`` of every string constant in code (not a docstring) holding llama vocabulary."""
    tree = ast.parse(source, filename=name)
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in skip:
            continue
        if VOCABULARY.search(node.value) or node.value in EXACT:
            yield node.lineno, node.value


def _found() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == ROOM:
                continue
            for _, literal in vocabulary_literals(path.read_text(encoding="utf-8"), rel):
                found.setdefault(rel, set()).add(literal)
    return found


def test_only_the_room_holds_llama_names() -> None:
    found = _found()
    stray = {
        f"{path}: {sorted(literals - ALLOWED.get(path, set()))}"
        for path, literals in found.items()
        if literals - ALLOWED.get(path, set())
    }
    assert not stray, f"llama-family vocabulary outside {ROOM}:\n" + "\n".join(sorted(stray))
    stale = {p: sorted(ls - found.get(p, set())) for p, ls in ALLOWED.items() if ls - found.get(p, set())}
    assert not stale, f"no longer used, remove from ALLOWED: {sorted(stale)}"


def test_the_scan_sees_code_literals_not_docstrings() -> None:
    source = (
        '"""Reads blk.0.attn_q.weight."""\n'
        "X = 'model.layers.0.self_attn.q_proj.weight'\n"
        '"""An attribute docstring: token_embd."""\n'
        "def f(layer):\n"
        '    """The ffn_down of a layer."""\n'
        "    return f'blk.{layer}.ffn_down.weight', 'w2', 'w22', 'hidden', 'my_output_norm'\n"
    )
    found = sorted(literal for _, literal in vocabulary_literals(source))
    assert found == [".ffn_down.weight", "blk.", "model.layers.0.self_attn.q_proj.weight", "w2"]
    assert VOCABULARY.search("attention.head_count_kv") and not VOCABULARY.search("my_output_norm")


def test_the_room_names_what_the_graph_reads() -> None:
    """Names built from the room parse back to the slots the registry binds (both schemes agree)."""
    for op, hf_stem in llama.HF_STEMS.items():
        layer, slot, expert = llama.parse_hf_name(llama.layer_name(3, op, gguf=False))
        gguf_layer, gguf_slot = llama.parse_gguf_name(llama.layer_name(3, op, gguf=True))
        assert (layer, slot, expert) == (3, hf_stem, None)
        assert gguf_layer == 3
        if op != "router":  # GGUF's router binds to the MoE slot, Mixtral's keeps its own stem
            assert gguf_slot == hf_stem
    assert llama.parse_gguf_name(llama.layer_name(3, "router", gguf=True)) == (3, llama.MOE_ROUTER_SLOT)
    assert llama.parse_hf_name(llama.layer_name(1, "q", gguf=False, leaf="bias"))[1] in llama.OPTIONAL_SLOTS
    for gguf in (False, True):
        embed, norm, head = llama.end_names(gguf, tied=False)
        parse = llama.parse_gguf_name if gguf else llama.parse_hf_name
        assert [parse(n)[1] for n in (embed, norm, head or "")] == [
            llama.EMBED_SLOT,
            llama.NORM_SLOT,
            llama.HEAD_SLOT,
        ]
        assert llama.end_names(gguf, tied=True)[2] is None
    stacks = [llama.parse_gguf_name(n) for n in llama.gguf_expert_stacks(2)]
    assert stacks == [(2, s) for s in llama.MOE_EXPERT_SLOTS]
    hf = [llama.parse_hf_name(n) for n in llama.hf_expert_names(2, 5)]
    assert [(layer, expert) for layer, _, expert in hf] == [(2, 5)] * 3
    # Mixtral's w1/w3/w2 split as gate/up (column, intermediate) and down (row, intermediate)
    assert [llama.slot_split(slot, 2) for _, slot, _ in hf] == [
        ("N", "intermediate"),
        ("N", "intermediate"),
        ("K", "intermediate"),
    ]


def test_split_rules_cover_every_dense_slot() -> None:
    """Each dense slot splits as the room's table says; norms replicate; fused operators never split."""
    want = [
        ("N", "heads"),
        ("N", "kv"),
        ("N", "kv"),
        ("K", "heads"),
        ("N", "intermediate"),
        ("N", "intermediate"),
        ("K", "intermediate"),
        None,
        None,
    ]
    assert [llama.slot_split(s, 2) for s in llama.DENSE_LAYER_SLOTS] == want
    assert [llama.slot_split(s, 2) for s in llama.VOCAB_SLOTS] == [("N", "vocab")] * 2
    assert llama.slot_split("self_attn.q_proj.bias", 1) == ("N", "heads")
    assert llama.slot_split("self_attn.o_proj.bias", 1) is None
    assert llama.slot_split("self_attn.qkv_proj", 2) is None


def test_parameter_spellings_agree() -> None:
    """The contract's GGUF keys and config keys are among placement's aliases, field for field."""
    pairs = {"layers": "num_layers", "heads": "num_heads", "kv_heads": "num_kv_heads", "hidden": "hidden"}
    pairs |= {"head_dim": "head_dim", "experts": "num_experts"}
    for field, alias in pairs.items():
        assert llama.CONFIG_KEYS[field] in llama.PARAM_ALIASES[alias]
        assert llama.GGUF_KEYS[field] in llama.PARAM_ALIASES[alias]
        gguf_params = {llama.gguf_key("llama", field): 12, "llama.other": 3}
        assert llama.model_param(gguf_params, alias) == 12
        assert llama.model_param({llama.CONFIG_KEYS[field]: 7}, alias) == 7
    assert llama.model_param({llama.CONFIG_KEYS["heads"]: 0}, "num_heads") is None
    # the manifest records every config.json key the graph contract reads
    assert set(llama.CONFIG_PARAMS) >= set(llama.CONFIG_KEYS.values())


def test_the_room_imports_nothing_of_shardport() -> None:
    """Pure vocabulary: no import of shardport (so every layer may import it) and none for I/O."""
    for path in sorted((ROOT / "registry" / "families").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        } | {
            ("." * node.level) + (node.module or "")
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        assert imported <= {"__future__", "re", "collections.abc", "dataclasses", "typing"}, (path, imported)
