"""The end-to-end demo on the embedded defaults: ``python -m shardport.deploy.demo``.

It generates a small llama-shaped safetensors checkpoint, then runs the registry's main job against
a local store: keygen, push v1, push v2 (only the changed shard moves), pull, verify, an intentional
rollback, the signed history, per-rank pulls at tp=2 (each rank reads and verifies only its tiles),
and a tamper attempt that is refused. Then it brings a small quantized llama (a GGUF of Q4_0 blocks,
tied embedding) up at tp=2 on the embedded local Ray (bound to 127.0.0.1), proves parity L0-L5,
stores the signed evidence, shows it, and writes the HTML report (``--report``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from safetensors.numpy import save_file

from shardport.cli import main as run
from shardport.registry.families import llama

console = Console()


def make_checkpoint(folder: Path, *, seed: int, layers: int = 2, hidden: int = 1024) -> None:
    """A tiny, complete llama-shaped float16 checkpoint: one shard per layer, one for the ends, a config."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, inter = 512, hidden * 2
    k = llama.CONFIG_KEYS
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", k["layers"]: layers}
    config |= {k["hidden"]: hidden, k["intermediate"]: inter, k["heads"]: 8, k["kv_heads"]: 4}
    config |= {k["vocab"]: vocab, k["norm_eps"]: 1e-05, k["tied_embeddings"]: False}
    (folder / "config.json").write_text(json.dumps(config))
    embed, norm, head = llama.end_names(gguf=False, tied=False)
    assert head is not None
    ends = {
        embed: rng.standard_normal((vocab, hidden), dtype=np.float32),
        norm: np.ones(hidden, dtype=np.float32),
        head: rng.standard_normal((vocab, hidden), dtype=np.float32) / np.sqrt(hidden),
    }
    save_file(
        {k: np.ascontiguousarray(v.astype(np.float16)) for k, v in ends.items()},
        str(folder / "model-embed.safetensors"),
    )
    for i in range(layers):
        shapes = {"q": (hidden, hidden), "k": (hidden // 2, hidden), "v": (hidden // 2, hidden)}
        shapes |= {"o": (hidden, hidden), "gate": (inter, hidden), "up": (inter, hidden)}
        shapes |= {"down": (hidden, inter)}
        f16 = np.float16
        arrays = {
            llama.layer_name(i, op, gguf=False): np.ascontiguousarray(rng.standard_normal(s).astype(f16))
            for op, s in shapes.items()
        }
        for op in ("input_norm", "post_norm"):
            arrays[llama.layer_name(i, op, gguf=False)] = np.ones(hidden, dtype=np.float16)
        save_file(arrays, str(folder / f"model-layer{i}.safetensors"))


def make_gguf(folder: Path, *, seed: int = 3, layers: int = 2, hidden: int = 256) -> None:
    """A tiny llama GGUF as llama.cpp lays one out: Q4_0 linears, a tied Q4_0 token embedding."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    heads, kv_heads, inter, vocab = 8, 4, 512, 512
    folder.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(layers)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    q40 = gguf.GGMLQuantizationType.Q4_0
    d = hidden // heads

    def q(shape: tuple[int, int], scale: float) -> np.ndarray:
        return quantize((rng.standard_normal(shape) * scale).astype(np.float32), q40)

    embed, norm, _ = llama.end_names(gguf=True, tied=True)
    w.add_tensor(embed, q((vocab, hidden), 1.0), raw_dtype=q40)
    shapes = {"q": (hidden, hidden), "k": (kv_heads * d, hidden), "v": (kv_heads * d, hidden)}
    shapes |= {"o": (hidden, hidden), "gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    for layer in range(layers):
        w.add_tensor(llama.layer_name(layer, "input_norm", gguf=True), np.ones(hidden, dtype=np.float32))
        for op, shape in shapes.items():
            w.add_tensor(llama.layer_name(layer, op, gguf=True), q(shape, 0.1), raw_dtype=q40)
        w.add_tensor(llama.layer_name(layer, "post_norm", gguf=True), np.ones(hidden, dtype=np.float32))
    w.add_tensor(norm, np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def step(title: str, *argv: str) -> int:
    """Run one registry command, showing it as a user would type it."""
    console.rule(f"[bold]{title}")
    console.print(f"$ registry {' '.join(argv)}", style="cyan")
    code = run(list(argv))
    console.print(f"[dim](exit {code})")
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--home", type=Path, help="SHARDPORT_HOME to use (default: a temporary folder)")
    parser.add_argument(
        "--report",
        type=Path,
        default=Path("bringup-report.html"),
        help="where the bring-up's HTML report goes (default: ./bringup-report.html)",
    )
    parser.add_argument("--no-bringup", action="store_true", help="stop after the registry steps")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns non-zero if any step does not behave as it must."""
    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shardport-demo-") as tmp:
        work = Path(tmp)
        os.environ["SHARDPORT_HOME"] = str(args.home or work / "home")
        os.environ.pop("SHARDPORT_STORE", None)
        make_checkpoint(work / "v1", seed=1)
        make_checkpoint(work / "v2", seed=1)
        make_checkpoint(work / "v2-layer1", seed=2)
        (work / "v2-layer1" / "model-layer1.safetensors").replace(work / "v2" / "model-layer1.safetensors")
        ref = "demo/llama-tiny:prod"
        failures = 0
        failures += step("make a signing key (trusted locally)", "keygen") != 0
        failures += step("push v1", "push", str(work / "v1"), ref) != 0
        failures += step("push v1 again: nothing moves", "push", str(work / "v1"), ref) != 0
        failures += step("push v2: only the changed shard moves", "push", str(work / "v2"), ref) != 0
        failures += step("pull (verified, atomic)", "pull", ref, str(work / "pulled")) != 0
        failures += step("verify the pulled folder", "verify", str(work / "pulled")) != 0
        failures += (
            step("roll back to v1", "rollback", ref, "--steps", "1", "--reason", "demo regression") != 0
        )
        failures += step("the signed tag history", "log", ref) != 0
        failures += step("pull again: v1's bytes", "pull", ref, str(work / "pulled")) != 0
        failures += step("verify everything in the store", "verify", ref) != 0
        failures += step("fsck", "fsck") != 0
        for rank in range(2):
            failures += (
                step(
                    f"tp=2 rank {rank}: pull only this rank's verified tiles",
                    "pull",
                    ref,
                    str(work / "ranks"),
                    "--tp",
                    "2",
                    "--rank",
                    str(rank),
                )
                != 0
            )
        failures += (
            step(
                "tp=4, one node holding ranks 0-3: one shared read, each byte once",
                "pull",
                ref,
                str(work / "node"),
                "--tp",
                "4",
                "--ranks",
                "all",
            )
            != 0
        )
        # A tampered blob is refused, and the previous pull stays as it was.
        from shardport.registry.session import Session
        from shardport.registry.store.keys import blob_key

        session = Session.open()
        manifest = (work / "pulled" / ".shardport" / "manifest.json").read_text()
        import json

        digest = json.loads(manifest)["files"][-1]["digest"]
        data = bytearray(session.store.read(blob_key(digest)))
        data[len(data) // 2] ^= 1
        session.store.put(blob_key(digest), bytes(data))
        code = step("tamper with a stored blob, then pull: refused", "pull", ref, str(work / "pulled"))
        failures += code != 1
        failures += step("the earlier pull is untouched", "verify", str(work / "pulled")) != 0
        if not args.no_bringup:
            failures += bring_up(work, args.report.resolve())
        console.rule()
        if failures:
            console.print(f"[bold red]demo: {failures} step(s) did not behave as expected")
            return 1
        console.print(
            "[bold green]demo complete: push, dedup, pull, verify, rollback, per-rank and per-node pulls, "
            "tamper refusal" + ("" if args.no_bringup else f", bring-up at tp=2 (report: {args.report})")
        )
        return 0


def bring_up(work: Path, report: Path) -> int:
    """Push a small quantized GGUF, bring it up at tp=2 on the embedded Ray, show the evidence."""
    make_gguf(work / "gguf")
    ref = "demo/llama-q4:prod"
    title = "push a small quantized llama (GGUF Q4_0, tied embedding)"
    failures = int(step(title, "push", str(work / "gguf"), ref) != 0)
    failures += (
        step(
            "bring it up at tp=2 on the embedded Ray (127.0.0.1 only): parity L0-L5, signed evidence",
            "up",
            ref,
            "--tp",
            "2",
            "--tokens",
            "1,17,42,300,7",
            "--generate",
            "4",
            "--report",
            str(report),
        )
        != 0
    )
    failures += step("the evidence attached to the manifest", "evidence", ref) != 0
    failures += step("verify checks the evidence's signature and subject too", "verify", ref) != 0
    return failures


if __name__ == "__main__":
    raise SystemExit(main())
