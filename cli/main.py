"""Root of the ``regis`` CLI: ``regis index ...``, ``regis search``, ``regis serve``, ``regis train ...``,
``regis eval``, ``regis photos``, ``regis backbones``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.collections import app as collections_app
from cli.duplicates import duplicates
from cli.index import app as index_app
from cli.index import worker
from cli.keys import app as keys_app
from cli.options import CollectionsRootOpt, Device, Weights
from cli.serve import serve
from cli.train import register as register_training

app = typer.Typer(
    name="regis",
    help="Multi-vector image retrieval: index folders of images, search them by example.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(index_app, name="index")
app.add_typer(collections_app, name="collections")
app.add_typer(keys_app, name="keys")
app.command("serve")(serve)
app.command("worker")(worker)
app.command("duplicates")(duplicates)
register_training(app)


@app.callback()
def root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of an error (also REGIS_DEBUG=1); without it an "
                                           "error is one line: exit status 2 for usage, 1 for failures.")
    ] = False,
) -> None:
    """Multi-vector image retrieval: index folders of images, search them by example."""


@app.command("backbones")
def backbones() -> None:
    """List the registered backbones."""
    from regis.models.registry import list_backbones

    for spec in list_backbones():
        typer.echo(f"{spec.name:24s} {spec.kind:4s} weights={spec.default_weights:8s} {spec.description}")
    typer.echo(f"{'timm:NAME':24s} vit  weights=hub      any timm ViT with register tokens (use --weights offline)")


@app.command("photos")
def photos(
    out_dir: Annotated[Path | None, typer.Argument(help="Folder to write the photos into (created). Default for "
                                                      "--source debian: ~/.cache/regis/photos.")] = None,
    source: Annotated[str, typer.Option("--source", help="python: the photos inside scikit-image, scikit-learn and "
                                        "matplotlib (21); debian: the real-photo training corpus from Debian "
                                        "packages (about 540 photos; apt-get download + dpkg -x, no root).")
                      ] = "python",
    cache: Annotated[Path | None, typer.Option("--cache", help="debian: where the .deb files and their extracted "
                                               "trees are kept (default ~/.cache/regis or $REGIS_CACHE).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="debian: seed of the train / val / test split.")] = 0,
    max_side: Annotated[int, typer.Option("--max-side", help="debian: longest side of a written photo, px "
                                          "(0: keep).")] = 1024,
) -> None:
    """Write real photos into a folder: the bundled ones (default), or the Debian real-photo corpus
    (``--source debian``: de-duplicated, with package and licence per photo and a seeded split by photo in
    DIR/corpus.json)."""
    from regis.errors import ConfigError

    if source == "python":
        from regis.data.sample_photos import collect_sample_photos

        if out_dir is None:
            raise ConfigError("give the folder to copy the photos into: regis photos DIR")
        paths = collect_sample_photos(out_dir)
        typer.echo(f"{len(paths)} photos in {out_dir}")
        return
    if source != "debian":
        raise ConfigError(f"--source must be python or debian, got {source!r}")
    from regis.data.debian_photos import DEFAULT_CACHE, fetch_and_build

    cache = cache or DEFAULT_CACHE
    out_dir = out_dir or cache / "photos"
    records = fetch_and_build(out_dir, cache=cache, seed=seed, max_side=max_side)
    counts = {s: sum(r.split == s for r in records) for s in ("train", "val", "test")}
    scenes = sum(r.kind == "scene" for r in records)
    typer.echo(f"{len(records)} photos ({scenes} scenes, {len(records) - scenes} objects) in {out_dir}: "
               f"train {counts['train']}, val {counts['val']}, test {counts['test']}; {out_dir / 'corpus.json'}")


@app.command("search")
def search(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(help="INDEX_DIR QUERY_IMAGE; with --collection just QUERY_IMAGE; with --id just INDEX_DIR "
                            "(or nothing with --collection).", show_default=False),
    ] = None,
    collection: Annotated[
        str | None, typer.Option("--collection", "-c", help="Search this collection (under --root).")
    ] = None,
    root: CollectionsRootOpt = None,
    image_id: Annotated[
        int | None, typer.Option("--id", help="More like this: query with the stored tokens of this image id.")
    ] = None,
    filter_: Annotated[
        str | None, typer.Option("--filter", help='Metadata filter: JSON ({"album": "trip", "year": {"gte": 2020}}) '
                                                 "or key:value[,key:value].")
    ] = None,
    k: Annotated[int, typer.Option("-k", help="Number of results.")] = 10,
    depth: Annotated[
        int | None, typer.Option("--depth", help="Candidates: FAISS neighbours per query token (k'); default: index's.")
    ] = None,
    candidates: Annotated[
        str | None, typer.Option("--candidates", help="Candidate method: bounded or depth; default: index's.")
    ] = None,
    exact: Annotated[bool, typer.Option("--exact", help="Score every image exactly (slow; the oracle).")] = False,
    weights: Weights = None,
    device: Device = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Search an index or collection with a query image (or an indexed image's id); prints rank, score, id and
    path, and on stderr a perfect match's score (max_score: an identical image scores close to it) and where the
    time went (load: imports, index and encoder; decode; encode; search).

    On the CPU the query is encoded without torch when the index's encoder has a query bundle on disk
    (``regis.models.query_bundle``: the backbone as ONNX, the readout in numpy; same tokens to float32
    rounding); the first search of an encoder without one encodes with torch, then writes the bundle.
    ``REGIS_QUERY_RUNTIME`` (the service's inference copies) or ``--device`` other than cpu keep the torch path."""
    import time

    t_start = time.perf_counter()
    from cli.options import index_dir_for
    from regis.errors import ConfigError
    from regis.indexes.filters import parse_filter

    paths = list(paths or [])
    index = paths.pop(0) if collection is None and paths else None
    index_dir = index_dir_for(index, collection, root)
    query_image = paths.pop(0) if paths else None
    if paths or (query_image is None) == (image_id is None):
        raise ConfigError("give one query: a QUERY_IMAGE or --id N (regis search INDEX_DIR QUERY_IMAGE, "
                          "regis search -c NAME QUERY_IMAGE, regis search -c NAME --id 7)")
    if query_image is not None and not query_image.is_file():
        raise ConfigError(f"query image {query_image} does not exist or is not a file")
    params = {"k": k, "depth": depth, "mode": "exact" if exact else "ann", "candidates": candidates}
    where = parse_filter(filter_)
    if where:
        params["where"] = where
    engine, encoder_name = _open_engine(index_dir, weights, device, by_id=image_id is not None)
    load_ms = (time.perf_counter() - t_start) * 1e3
    try:
        if image_id is not None:
            try:
                result = engine.search_id(image_id, **params)
            except KeyError:
                raise ConfigError(f"no image with id {image_id} in {index_dir}") from None
            result["timings_ms"] = {"decode": 0.0, "encode": 0.0, **result["timings_ms"]}
        else:
            result = engine.search_file(query_image, **params)
        if encoder_name == "torch":
            _save_query_bundle(engine.encoder)
    finally:
        engine.close()
    result["timings_ms"] = {"load": load_ms, **result["timings_ms"]}
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    for hit in result["results"]:
        typer.echo(f"{hit['rank']:4d}  {hit['score']:8.4f}  id={hit['id']:<8d} {hit['path']}")
    t = result["timings_ms"]
    typer.echo(
        f"version {result['index_version']}, {result['num_candidates']} candidates, a perfect match scores "
        f"{result['max_score']:g}; ms: load {t['load']:.0f} "
        f"(imports, index, {encoder_name} encoder), decode {t['decode']:.1f}, encode {t['encode']:.1f}, search "
        f"{t['candidates'] + t['rerank']:.1f} (candidates {t['candidates']:.1f}, rerank {t['rerank']:.1f})",
        err=True,
    )


def _open_engine(index_dir: Path, weights: Path | None, device: str, by_id: bool):
    """The query engine of one ``regis search`` and the name of its encoder ("onnx+numpy", "none" for a
    search by id, or "torch"): the torch-free ``LightQueryEngine`` when it can serve (CPU, no ``--weights``, no
    ``REGIS_QUERY_RUNTIME``, a bundle or no encoder needed), else ``QueryEngine`` with the encoder itself. The
    bundle is the index's own encoder: ``--weights`` takes the encoder path, which loads and checks them (a file
    that does not exist, or weights other than the index's, is an error there, not silently ignored)."""
    if device == "cpu" and weights is None and "REGIS_QUERY_RUNTIME" not in os.environ:
        from regis.retrieve.light import LightQueryEngine

        light = LightQueryEngine.open(index_dir, need_encoder=not by_id)
        if light is not None:
            return light, "no" if by_id else "onnx+numpy"
    from regis.retrieve.query import QueryEngine, set_torch_threads

    # One small forward pass: one torch thread (REGIS_TORCH_THREADS overrides). Two threads gain a few ms on an
    # idle machine, and on a busy one their spin-waiting made encoding one photo take seconds (0.07 s of CPU on
    # one thread, 1-3 s on two, here at load 18).
    set_torch_threads(int(os.environ.get("REGIS_TORCH_THREADS") or 1))
    # One query: the fast inference copy (made and checked against the encoder: three forward passes, an ONNX
    # export for ONNX Runtime) would cost more than it saves; REGIS_QUERY_RUNTIME asks for it anyway.
    fast = "REGIS_QUERY_RUNTIME" in os.environ
    engine = QueryEngine.open(index_dir, weights=str(weights) if weights else None, device=device,
                              fast_encode=fast)
    return engine, "torch"


def _save_query_bundle(encoder) -> None:
    """Write ``encoder``'s query bundle after a torch search (``write_query_bundle``) so that later searches
    skip torch; says so on stderr. A failure (an encoder the numpy readout does not cover, onnx missing, a
    cache folder that cannot be written) is a note, not an error: this search has its answer."""
    import time

    from regis.models.np_readout import unsupported_reason
    from regis.models.query_export import write_query_bundle

    if unsupported_reason(encoder.config) or next(encoder.parameters()).device.type != "cpu":
        return
    t0 = time.perf_counter()
    try:
        folder = write_query_bundle(encoder)
    except Exception as exc:  # noqa: BLE001  a note: the search itself succeeded
        typer.echo(f"note: no torch-free query encoder saved ({type(exc).__name__}: {exc})", err=True)
        return
    typer.echo(f"saved the torch-free query encoder to {folder} ({time.perf_counter() - t0:.1f} s): later "
               "searches with this encoder skip torch", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``regis`` script. An error is one line on stderr (``cli.errors``: plus a ``hint:`` line
    where one helps), exit status 2 for usage and 1 for failures, 130 when interrupted; ``--debug`` (anywhere on
    the command line) or ``REGIS_DEBUG=1`` adds the traceback."""
    from cli.errors import debug_requested, report

    args = list(sys.argv[1:] if argv is None else argv)
    debug = debug_requested(args)
    args = [a for a in args if a != "--debug"]
    try:
        code = app(args=args, prog_name="regis", standalone_mode=False)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001  every error leaves as one line (cli.errors)
        sys.exit(report(exc, debug))
    sys.exit(code if isinstance(code, int) else 0)
