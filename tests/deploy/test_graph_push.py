"""Push records the graph contract and the tokenizer; ``graph_of`` and ``load_tokenizer`` for bring-up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llama_artifacts import HEADS, HIDDEN, INTER, LAYERS, gguf_smollm, gptq_llama
from support import Cli

from shardport.deploy.errors import TokenizerDigestError, UnsupportedTokenizerError
from shardport.deploy.tokenizer import load_tokenizer, read_tokenizer
from shardport.registry.artifact.manifest import Manifest
from shardport.registry.artifact.tokenizer_record import parts_digest
from shardport.registry.checkpoint.model_graph import graph_of
from shardport.registry.contracts.errors import UnsupportedArchitectureError
from shardport.registry.store.protocol import open_store


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, home: Path) -> Cli:
    c = Cli(capsys, str(tmp_path / "store"))
    c.ok("keygen")
    return c


TEXT = "Hello world, hello tokens! 123 naïve café\nsecond line"


def _train(vocab: int) -> Any:
    """A small byte-level BPE built with the tokenizers library (GPT-2's pre-tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>", "</s>"],
        show_progress=False,
    )
    tok.train_from_iterator(
        [TEXT, "hello hello world world tokens tokens", "the cat sat on the mat"] * 4, trainer
    )
    return tok


def _gguf_tokenizer(tok: Any, model: str = "gpt2") -> Any:
    doc = json.loads(tok.to_str())
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]

    def add(w: Any) -> None:
        w.add_tokenizer_model(model)
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([3 if t in ("<s>", "</s>") else 1 for t in tokens])
        w.add_token_merges(merges)
        w.add_bos_token_id(vocab["<s>"])
        w.add_eos_token_id(vocab["</s>"])
        w.add_add_bos_token(True)

    return add, len(tokens)


def _manifest(cli: Cli, ref: str) -> Manifest:
    return Manifest.model_validate(cli.ok("inspect", ref)["manifest"])


def test_config_json_llama_records_graph_and_tokenizer(cli: Cli, tmp_path: Path) -> None:
    folder = gptq_llama(tmp_path / "gptq")
    tok = _train(300)
    (folder / "tokenizer.json").write_text(tok.to_str())
    (folder / "tokenizer_config.json").write_text('{"add_bos_token": false}')
    cli.ok("push", folder, "acme/gptq:v1")
    shown = cli.ok("inspect", "acme/gptq:v1")["manifest"]["model"]
    assert shown["graph"]["heads"] == HEADS and shown["graph"]["source"] == "config.json"  # inspect shows it
    manifest = _manifest(cli, "acme/gptq:v1")
    g = manifest.model.graph
    assert g is not None and graph_of(manifest) == g
    assert (g.architecture, g.layers, g.hidden, g.heads, g.kv_heads, g.head_dim, g.intermediate, g.vocab) == (
        "LlamaForCausalLM",
        LAYERS,
        HIDDEN,
        HEADS,
        HEADS,
        HIDDEN // HEADS,
        INTER,
        256,
    )
    assert (g.rope_pairs, g.rope_base, g.tied_embeddings, g.moe) == ("half", 10000.0, False, False)
    assert not manifest.notes
    record = manifest.model.tokenizer
    assert record is not None and record.source == "tokenizer.json"
    by_path = {e.path: e.digest for e in manifest.files}
    assert [(p.path, p.digest, p.end) for p in record.parts] == [
        ("tokenizer.json", by_path["tokenizer.json"], None),
        ("tokenizer_config.json", by_path["tokenizer_config.json"], None),
    ]
    assert record.digest == parts_digest(record.parts)

    # the pulled folder's tokenizer round-trips and encodes like the library's own
    dest = tmp_path / "pulled"
    cli.ok("pull", "acme/gptq:v1", dest)
    loaded = load_tokenizer(manifest, dest)
    ids = loaded.encode(TEXT)
    assert ids == tok.encode(TEXT).ids and len(ids) < len(TEXT.encode())  # merges applied
    assert loaded.decode(ids) == TEXT

    # a tampered tokenizer file is refused, naming the file and both digests
    data = (dest / "tokenizer.json").read_bytes()
    with pytest.raises(TokenizerDigestError, match=r"tokenizer\.json.*expected sha256") as err:
        load_tokenizer(
            manifest,
            {
                "tokenizer.json": data.replace(b'"Hello', b'"Hellp', 1) + b" ",
                "tokenizer_config.json": b'{"add_bos_token": false}',
            },
        )
    assert err.value.exit_code == 1


def test_gguf_llama_records_graph_and_tokenizer_from_the_header(cli: Cli, tmp_path: Path) -> None:
    tok = _train(300)
    add, vocab = _gguf_tokenizer(tok)
    folder = gguf_smollm(tmp_path / "smol", layers=1, vocab=vocab, extra=add)
    cli.ok("push", folder, "acme/smol:v1")
    manifest = _manifest(cli, "acme/smol:v1")
    g = graph_of(manifest)
    assert g == manifest.model.graph
    assert (g.source, g.architecture, g.layers, g.hidden, g.heads, g.kv_heads, g.head_dim, g.vocab) == (
        "gguf",
        "llama",
        1,
        576,
        9,
        3,
        64,
        vocab,
    )
    assert (g.rope_pairs, g.tied_embeddings, g.intermediate) == ("interleaved", True, 1536)
    record = manifest.model.tokenizer
    [entry] = manifest.files
    assert record is not None and record.source == "gguf" and entry.gguf_header is not None
    [part] = record.parts
    assert (part.path, part.digest, part.end) == (
        "model.gguf",
        entry.gguf_header.digest,
        entry.gguf_header.end,
    )

    # one range read of the header is all the tokenizer needs: straight from the store's blob
    header = (folder / "model.gguf").read_bytes()[: part.end]
    read = read_tokenizer(open_store(cli.store), manifest)
    assert read == {"model.gguf": header}
    loaded = load_tokenizer(manifest, read)
    ids = loaded.encode(TEXT)
    bos = tok.token_to_id("<s>")
    assert ids == [bos, *tok.encode(TEXT).ids]  # the GGUF says add_bos_token
    assert loaded.decode(ids) == TEXT and loaded.vocab_size == vocab

    tampered = bytearray(header)
    at = tampered.find(b"hello")
    tampered[at] = ord("j")
    with pytest.raises(TokenizerDigestError, match=r"model\.gguf: bytes \[0, \d+\)"):
        load_tokenizer(manifest, {"model.gguf": bytes(tampered)})


def test_unsupported_architecture_is_a_note_and_graph_of_refuses(cli: Cli, tmp_path: Path) -> None:
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_layer": 2}))
    (folder / "weights.bin").write_bytes(b"\0" * 64)
    (folder / "tokenizer.model").write_bytes(b"\x0a\x05hello")  # SentencePiece, without tokenizer.json
    pushed = cli.ok("push", folder, "acme/gpt2:v1")
    manifest = _manifest(cli, "acme/gpt2:v1")
    [note] = manifest.notes
    assert (note.code, note.field) == ("UnsupportedArchitectureError", "architecture")
    assert "GPT2LMHeadModel" in note.found and note.message in pushed["notes"]
    assert manifest.model.graph is None
    assert manifest.model.tokenizer is not None and manifest.model.tokenizer.source == "sentencepiece"
    with pytest.raises(UnsupportedTokenizerError, match=r"'sentencepiece' package.*--tokens"):
        load_tokenizer(manifest, folder)
    with pytest.raises(UnsupportedArchitectureError, match="GPT2LMHeadModel") as err:
        graph_of(manifest)
    assert err.value.exit_code == 5


def test_sentencepiece_gguf_vocabulary_round_trips(cli: Cli, tmp_path: Path) -> None:
    """A llama (SentencePiece) vocabulary: byte tokens, scored merges, BOS added as llama.cpp does."""
    pieces = [
        "\u2581",
        "h",
        "e",
        "l",
        "o",
        "\u2581h",
        "he",
        "ll",
        "\u2581he",
        "\u2581hell",
        "\u2581hello",
        "lo",
    ]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256)), *pieces]

    def add(w: Any) -> None:
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))])
        w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)

    folder = gguf_smollm(tmp_path / "spm", layers=1, vocab=len(tokens), extra=add)
    cli.ok("push", folder, "acme/spm:v1")
    manifest = _manifest(cli, "acme/spm:v1")
    loaded = load_tokenizer(manifest, folder)
    ids = loaded.encode("hello hell!")
    # BOS, two pieces, and "!" (no piece) by byte fallback as <0x21>
    assert ids == [1, tokens.index("\u2581hello"), tokens.index("\u2581hell"), tokens.index("<0x21>")]
    assert loaded.decode(ids) == "hello hell!"


def test_a_newer_graph_record_round_trips_and_is_refused(tmp_path: Path) -> None:
    from shardport.registry.artifact.manifest import ContainerInfo, ModelInfo
    from shardport.registry.contracts.errors import GraphContractError
    from shardport.registry.contracts.graph import graph_contract

    config = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1}
    config |= {"intermediate_size": 96, "vocab_size": 50, "rms_norm_eps": 1e-5}
    g = graph_contract("LlamaForCausalLM", config)
    m = Manifest(container=ContainerInfo(kind="other"), files=[], model=ModelInfo(graph=g))
    again = Manifest.from_bytes(m.to_bytes())
    assert isinstance(again.model.graph, type(g)) and graph_of(again) == g  # parsed back as a contract
    newer = m.model_dump(mode="json", by_alias=True)
    newer["model"]["graph"] |= {"version": 2, "sliding": 4096}
    kept = Manifest.model_validate(newer)
    assert Manifest.from_bytes(kept.to_bytes()).to_bytes() == kept.to_bytes()  # kept unchanged
    with pytest.raises(GraphContractError, match="newer shardport"):
        graph_of(kept)


def test_keys_the_contract_reads_reach_the_manifest(cli: Cli, tmp_path: Path) -> None:
    """sliding_window / rope_parameters are recorded in model.params, so push sees what the graph lacks."""
    folder = tmp_path / "mistral"
    folder.mkdir()
    config = {"architectures": ["MistralForCausalLM"], "hidden_size": 64, "num_attention_heads": 4}
    config |= {"num_hidden_layers": 1, "intermediate_size": 96, "vocab_size": 50, "hidden_act": "silu"}
    config |= {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    (folder / "config.json").write_text(json.dumps(config | {"sliding_window": 4096}))
    cli.ok("push", folder, "acme/mistral:sw")
    manifest = _manifest(cli, "acme/mistral:sw")
    assert manifest.model.params["sliding_window"] == 4096 and manifest.model.graph is None
    [note] = manifest.notes
    assert (note.code, note.field) == ("UnsupportedOperatorError", "sliding_window")

    (folder / "config.json").write_text(json.dumps(config | {"sliding_window": None}))
    cli.ok("push", folder, "acme/mistral:full")
    g = graph_of(_manifest(cli, "acme/mistral:full"))
    assert g.rope_base == 1e6  # from transformers v5 rope_parameters, not the 10000 default


def test_header_only_metadata_reads_the_tokenizer_and_refuses_a_cut_header(tmp_path: Path) -> None:
    from shardport.registry.formats.errors import ContainerError
    from shardport.registry.formats.gguf_gate import GGUFLimits, parse_gguf, parse_gguf_metadata
    from shardport.registry.formats.source import BytesSource

    add, vocab = _gguf_tokenizer(_train(270))
    path = gguf_smollm(tmp_path / "m", layers=1, vocab=vocab, extra=add) / "model.gguf"
    full = parse_gguf(path)
    header = path.read_bytes()[: full.kv_end]
    meta = parse_gguf_metadata(BytesSource(header, "model.gguf"), GGUFLimits(max_kept_array_len=1 << 20))
    assert meta.kv_end == full.kv_end and set(meta.kv) == set(full.kv)
    tokens = meta.kv["tokenizer.ggml.tokens"]
    assert tokens.length == vocab and tokens.values is not None and len(tokens.values) == vocab
    with pytest.raises(ContainerError, match=r"model\.gguf"):
        parse_gguf_metadata(BytesSource(header[:-7], "model.gguf"))
