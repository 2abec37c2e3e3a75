"""The command line: `embedx serve | info | check | embed`, every setting also a flag."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embedx.config import Settings, env_name, load_settings
from embedx.errors import ConfigError, EmbedxError, PoolingRequired

if TYPE_CHECKING:
    from embedx.models.catalog import ModelSpec

# `embedx check` exit codes, documented in DEPLOY.md
EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_DEVICES = 3
EXIT_WARM = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "settings (each also EMBEDX_<NAME> or a key in $EMBEDX_CONFIG)"
    )
    for f in dataclasses.fields(Settings):
        group.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=None,
            metavar="VALUE",
            help=f"{f.metadata['help']} [{env_name(f.name)}]",
        )


def _add_job_flags(embed: argparse.ArgumentParser) -> None:
    job = embed.add_argument_group("a corpus job (docs/jobs.md)")
    job.add_argument("-o", "--output", help="write vectors here (.parquet, .npy, .safetensors)")
    job.add_argument("--text-field", default="text", help="the texts' field or column")
    job.add_argument("--id-field", default="id", help="the ids' field (else the row number)")
    job.add_argument("--input-type", help="the prompt to wrap each text in (query, passage...)")
    job.add_argument("--dimensions", type=int, help="cut vectors to N (a matryoshka model)")
    job.add_argument("--skip-bad", action="store_true", help="skip bad lines, list them")
    job.add_argument("--chunk-texts", type=int, help="texts a chunk (read, embedded, saved)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embedx", description="Text embeddings on every GPU.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP server")
    info = commands.add_parser("info", help="print the settings and devices; loads no model")
    info.add_argument("--json", action="store_true", help="print JSON")
    check = commands.add_parser("check", help="validate settings and devices (preflight)")
    check.add_argument("--warm", metavar="MODEL", help="also load MODEL, embed once, unload")
    check.add_argument("--warm-pooling", metavar="POOLING", help="pooling for --warm")
    embed = commands.add_parser(
        "embed", help="embed texts given as arguments or on stdin, or files of them (-o)"
    )
    embed.add_argument("model")
    embed.add_argument(
        "texts", nargs="*", help="texts (default: one per line on stdin); with -o, input files"
    )
    embed.add_argument("--pooling", dest="model_pooling")
    _add_job_flags(embed)
    convert = commands.add_parser(
        "convert-heads",
        help="write BGE-M3's torch-pickle heads (sparse_linear.pt, colbert_linear.pt) in "
        "DIRECTORY as safetensors beside them, once: embedx loads only safetensors",
    )
    convert.add_argument("directory")
    for command in (serve, info, check, embed):
        _add_setting_flags(command)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    names = {f.name for f in dataclasses.fields(Settings)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return load_settings(given)


def _info(settings: Settings, as_json: bool) -> int:
    from embedx.allocator import process_allocator
    from embedx.devices import discover

    devices = [d.as_dict() for d in discover(settings)]
    malloc = process_allocator()
    if as_json:
        document = {"settings": settings.redacted(), "devices": devices, "allocator": malloc}
        print(json.dumps(document, indent=2))
        return EXIT_OK
    print("settings:")
    for key, value in settings.redacted().items():
        print(f"  {key:26} {value}")
    print(f"allocator: {malloc} (DEPLOY.md: 'The memory allocator')")
    print("devices (fastest first, by static score until a model measures them):")
    header = ("device", "name", "free/total GiB", "SMs/cores", "cc", "score")
    print("  {:8} {:28} {:>15} {:>9} {:>4} {:>7}".format(*header))
    for d in devices:
        memory = f"{d['free_memory_bytes'] / 2**30:.1f}/{d['total_memory_bytes'] / 2**30:.1f}"
        print(
            f"  {d['device']:8} {d['name'][:28]:28} {memory:>15} {d['multiprocessors']:>9} "
            f"{d['compute_capability'] or '-':>4} {d['score']:>7}"
        )
    return EXIT_OK


async def _warm(settings: Settings, model: str, pooling: str | None) -> dict[str, Any]:
    from embedx.devices import discover, open_accelerator
    from embedx.models.catalog import load_catalog
    from embedx.registry import LoadRequest, ModelRegistry

    registry = ModelRegistry(
        settings, load_catalog(settings.models_file), discover(settings), open_accelerator
    )
    try:
        async with registry.lease(model, LoadRequest(pooling=pooling)) as engine:
            result = await engine.embed(["embedx check --warm"])
            described = engine.engine.describe()
            described["vector_dimensions"] = int(result.vectors.shape[1])
    finally:
        await registry.drain(settings.drain_timeout_s)
    described["resident_after"] = len(registry.residents())
    return described


def _check(settings: Settings, warm: str | None, pooling: str | None) -> int:
    from embedx.devices import discover
    from embedx.models.catalog import load_catalog
    from embedx.models.source import check_exists
    from embedx.registry import check_default_model, check_preload

    try:
        catalog = load_catalog(settings.models_file)
    except EmbedxError as exc:
        print(f"embedx check: catalog: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        check_preload(settings, catalog)
        check_default_model(settings, catalog)
    except EmbedxError as exc:
        print(f"embedx check: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    built_in = load_catalog(None)
    for name, spec in catalog.items():  # nowhere: `serve` would stop (preloaded) or 404 it
        try:
            check_exists(spec.source, spec.revision)
        except EmbedxError as exc:
            role = "EMBEDX_PRELOAD's" if name in settings.preload else "catalog model"
            needed = name in settings.preload or name == settings.default_model
            if built_in.get(name) == spec and not needed:  # a built-in one nobody asked for
                print(f"embedx check: note: built-in {role} {name!r}: {exc.message}")
                continue
            print(f"embedx check: {role} {name!r}: {exc.message}", file=sys.stderr)
            return EXIT_CONFIG
    unpooled = _embedding_without_pooling(settings, catalog)
    if unpooled is not None:
        print(f"embedx check: {unpooled}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        devices = discover(settings)
    except EmbedxError as exc:
        print(f"embedx check: devices: {exc.message}", file=sys.stderr)
        return EXIT_DEVICES
    except Exception as exc:  # a broken driver shows up here
        print(f"embedx check: devices: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_DEVICES
    print(f"embedx check: settings ok; devices: {', '.join(d.label for d in devices)}")
    if warm:
        try:
            described = asyncio.run(_warm(settings, warm, pooling))
        except PoolingRequired:
            print(f"embedx check: warm {warm}: the catalog does not say how it pools: add "
                  "--warm-pooling cls|mean|last_token", file=sys.stderr)  # fmt: skip
            return EXIT_WARM
        except EmbedxError as exc:
            print(f"embedx check: warm {warm}: {exc.message}", file=sys.stderr)
            return EXIT_WARM
        print(f"embedx check: warmed {warm}: {json.dumps(described)}")
    return EXIT_OK


def _embedding_without_pooling(settings: Settings, catalog: dict[str, ModelSpec]) -> str | None:
    """What `serve` would stop on: a preloaded (or default) model that embeds texts, whose
    catalog entry states no pooling (a reranker's needs none; its files say which it is)."""
    from embedx.models.source import resolve
    from embedx.models.task import task_of

    for name in (*settings.preload, settings.default_model):
        spec = catalog.get(name) if name is not None else None
        if spec is None or spec.pooling is not None:
            continue
        try:
            files = resolve(spec.source, spec.revision)
            task = task_of(files.config, files.directory)
        except EmbedxError as exc:
            return f"{name!r}: {exc.message}"
        if task.kind == "embed":
            return (
                f"{name!r} embeds texts, and its catalog entry is without a pooling: add "
                "pooling = cls, mean or last_token to it (embedx never guesses pooling)"
            )
    return None


def stdin_texts(lines: Iterable[str]) -> list[str]:
    """A text a line, without its line end (a Windows file's \r too) or a byte-order mark."""
    texts = [line.rstrip("\r\n") for line in lines]
    if texts:
        texts[0] = texts[0].removeprefix("\ufeff")
    return texts


def _embed(settings: Settings, model: str, texts: Sequence[str], pooling: str | None) -> int:
    from embedx.embedder import Embedder

    if not texts:  # a vector a line, in order: a blank line has none, so it is an error
        texts = stdin_texts(sys.stdin)
        blank = [number for number, text in enumerate(texts, 1) if not text.strip()]
        if blank:
            print(f"embedx: stdin lines {blank[:10]} are blank; each line is a text, and its "
                  "vector is the output's line of the same number", file=sys.stderr)  # fmt: skip
            return 1
    try:
        embedder = Embedder(model, pooling=pooling, settings=settings)
    except PoolingRequired:
        print(f"embedx: the catalog does not say how {model!r} pools: add "
              "--pooling cls|mean|last_token", file=sys.stderr)  # fmt: skip
        return 1
    with embedder:
        for vector in embedder.embed(texts):
            print(json.dumps([round(float(x), 7) for x in vector]))
    return EXIT_OK


def _embed_corpus(settings: Settings, args: argparse.Namespace) -> int:
    try:
        from embedx.jobs import CorpusJob, command
        from embedx.jobs.corpus import CHUNK_TEXTS
    except ModuleNotFoundError as exc:
        print(f"embedx: a corpus job needs the jobs' packages ({exc.name} is missing): "
              'pip install "embedx-inference[jobs]"', file=sys.stderr)  # fmt: skip
        return 1
    from embedx.jobs.inputs import Fields

    if not args.texts:
        print("embedx: name the input files (or folders, or globs) to embed", file=sys.stderr)
        return 1
    job = CorpusJob(
        model=args.model,
        inputs=args.texts,
        output=Path(args.output),
        pooling=args.model_pooling,
        fields=Fields(args.text_field, args.id_field),
        input_type=args.input_type,
        dimensions=args.dimensions,
        skip_bad=args.skip_bad,
        chunk_texts=CHUNK_TEXTS if args.chunk_texts is None else args.chunk_texts,
    )
    return command(job, settings)


def _run(args: argparse.Namespace) -> int:
    if args.command == "convert-heads":
        return _convert_heads(args.directory)
    settings = _settings(args)
    if args.command == "info":
        return _info(settings, args.json)
    if args.command == "check":
        return _check(settings, args.warm, args.warm_pooling)
    if args.command == "embed" and args.output is not None:
        return _embed_corpus(settings, args)
    if args.command == "embed":
        return _embed(settings, args.model, args.texts, args.model_pooling)
    try:
        from embedx.server.run import serve
    except ModuleNotFoundError as exc:  # the library alone was installed
        print(f"embedx: serving needs the server's packages ({exc.name} is missing): "
              'pip install "embedx-inference[server]"', file=sys.stderr)  # fmt: skip
        return 1
    return serve(settings)


def _convert_heads(directory: str) -> int:
    """Read each .pt head with torch.load(weights_only=True): tensors only, no code run."""
    from embedx.models.m3 import convert_heads

    for written in convert_heads(Path(directory)):
        print(f"wrote {written}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    # `embed MODEL --pooling mean "a text"`: argparse leaves texts after a flag over, and
    # subparsers rule out its intermixed parsing; those are texts too.
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command != "embed" or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.texts = [*args.texts, *extra]
    try:
        code = _run(args)
        sys.stdout.flush()  # here, not at exit: a reader gone is an EPIPE caught below
        return code
    except BrokenPipeError:  # `| head`: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:  # Ctrl-C (`serve` handles its own signals)
        print("embedx: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ConfigError as exc:
        print(f"embedx: {exc.message}", file=sys.stderr)
        return EXIT_CONFIG
    except EmbedxError as exc:
        print(f"embedx: {exc.message}", file=sys.stderr)
        return 1
