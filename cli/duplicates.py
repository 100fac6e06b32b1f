"""``regis duplicates``: the near-duplicate groups of an index or collection (``regis.duplicates``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.options import CollectionsRootOpt


def _progress():
    """A (stage, done, total) callback drawing one tqdm bar per stage on stderr."""
    from tqdm import tqdm

    bars: dict = {}

    def update(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            bar = bars[stage] = tqdm(total=total, desc={"search": "searching", "verify": "verifying pairs"}[stage],
                                     unit={"search": "img", "verify": "pair"}[stage], leave=False)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def _image_line(img: dict, note: str) -> str:
    size = f"{img['width']} x {img['height']}" if img["width"] else "?"
    return f"    {img['id']:>7d}  {img['path'] or '(gone)'}  {size}  {note}".rstrip()


_SHORT = {"exact": "exact copy of {other}", "edited_copy": "edited copy of {other}",
          "same_scene": "same scene as {other}"}


def _note(p: dict, me: int) -> str:
    """How image ``me`` relates to the other image of pair ``p``, in a few words."""
    other = p["b"] if p["a"] == me else p["a"]
    if p["relation"] == "crop":
        return f"crop of {other}" if p["contains"] == other else f"contains {other} (a crop of it)"
    return _SHORT[p["relation"]].format(other=other)


def _best_pair(pairs: list[dict], me: int, prefer: int | None) -> dict | None:
    """The pair that best says what ``me`` is: the one with ``prefer`` (the image to keep), else its highest
    score."""
    mine = [p for p in pairs if me in (p["a"], p["b"])]
    if not mine:
        return None
    with_keep = [p for p in mine if prefer in (p["a"], p["b"])]
    return (with_keep or sorted(mine, key=lambda p: -max(p["scores"].values())))[0]


def print_report(out: dict) -> None:
    """The report as text: a summary, then every group: its images, each with what it is to the image to keep
    (or to its closest member), then the crops and other shots beside the group."""
    c, run = out["counts"], out["run"]
    pairs = c["pairs"]
    t = run["timings_ms"]
    reused = (f", {run['reused_pairs']} pairs kept from version {run['from_version']}"
              if run["from_version"] is not None else "")
    when = "now" if run["computed_now"] else "stored with this version"
    typer.echo(f"index version {out['index_version']}: {run['candidate_pairs']} candidate pairs ({when}: "
               f"{run['searched']} images searched{reused}; {t.get('total', 0) / 1000:.1f} s)")
    typer.echo(f"{c['duplicate_groups']} duplicate groups ({c['images_in_duplicate_groups']} images, "
               f"{c['redundant_images']} beyond one per group); pairs: {pairs['exact']} exact, "
               f"{pairs['edited_copy']} edited copies, {pairs['crop']} crops, {pairs['same_scene']} same scene"
               + ("" if out["calibrated"] else "  [thresholds not calibrated for this encoder]"))
    for n, g in enumerate(out["groups"], start=out["offset"] + 1):
        keep = g["keep"]
        head = f"{len(g['images'])} images, keep {keep}?" if keep is not None else "1 image"
        typer.echo(f"\ngroup {n}: {head}")
        for img in sorted(g["images"], key=lambda i: i["id"] != keep):
            p = None if img["id"] == keep else _best_pair(g["pairs"], img["id"], keep)
            typer.echo(_image_line(img, "keep" if img["id"] == keep else (_note(p, img["id"]) if p else "")))
        for img in g["related_images"]:
            p = _best_pair(g["related"], img["id"], keep)
            typer.echo(_image_line(img, f"beside the group: {_note(p, img['id'])}" if p else "beside the group"))
    shown = out["offset"] + len(out["groups"])
    if shown < out["total_groups"]:
        typer.echo(f"\n... {out['total_groups'] - shown} more groups (--offset {shown}); every pair with its scores "
                   "and geometry: --json")


def duplicates(
    index: Annotated[Path | None, typer.Argument(help="Index directory (or use --collection).")] = None,
    collection: Annotated[str | None, typer.Option("--collection", "-c", help="A collection under --root.")] = None,
    root: CollectionsRootOpt = None,
    limit: Annotated[int, typer.Option("--limit", help="Groups to show.")] = 20,
    offset: Annotated[int, typer.Option("--offset", help="Skip the first groups (paging).")] = 0,
    explain: Annotated[bool, typer.Option("--explain", help="Add each pair's token explanation (JSON).")] = False,
    merge: Annotated[list[str] | None, typer.Option("--merge", help="Also join groups through this relation: crop "
                                                                   "or same_scene (repeatable).")] = None,
    relation: Annotated[list[str] | None, typer.Option("--relation", help="Report only this relation: exact, "
                                                                         "edited_copy, crop, same_scene "
                                                                         "(repeatable).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a threshold for this run, NAME=VALUE "
                                                                "(e.g. floor=0.5; repeatable; see --show-config).")]
    = None,
    save: Annotated[bool, typer.Option("--save", help="Write the --set values into the index's duplicates config "
                                                      "(they become its defaults).")] = False,
    show_config: Annotated[bool, typer.Option("--show-config", help="Print the index's thresholds and exit.")] = False,
    full: Annotated[bool, typer.Option("--full", help="Search every image again (default: only images added or "
                                                      "changed since the last run).")] = False,
    uploads: Annotated[Path | None, typer.Option("--uploads", help="Folder of the index's uploaded files (default: "
                                                                   "the index's own).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON answer of the REST route.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bars on stderr.")] = True,
) -> None:
    """Find every exact copy, edited copy, crop and other shot of the same scene in an index or collection, and say
    why. Groups are connected components of exact and edited copies; crops and same-scene pairs are listed beside
    them. Results are stored with the index version: a second run after new images only searches those."""
    from cli.options import collections_root, index_dir_for
    from regis.duplicates.api import find_duplicates, index_config
    from regis.duplicates.config import parse_overrides, save_config
    from regis.duplicates.finder import index_file_resolver
    from regis.errors import ConfigError
    from regis.indexes.snapshot import IndexSnapshot
    from regis.sharding.layout import is_sharded

    index_dir = index_dir_for(index, collection, root)
    if is_sharded(index_dir):
        raise ConfigError(f"{index_dir} is a sharded collection: duplicates work on unsharded indexes and collections "
                          "for now")
    overrides = parse_overrides(set_)
    snapshot = IndexSnapshot.open(index_dir)
    try:
        config = index_config(snapshot)
        if save:
            path = save_config(index_dir, config.with_overrides(overrides))
            typer.echo(f"thresholds written to {path}", err=True)
        if show_config:
            typer.echo(json.dumps(config.with_overrides(overrides).model_dump(), indent=2))
            return
        if uploads is None and collection is not None:
            uploads = collections_root(root).path(collection) / "uploads"
        try:
            out = find_duplicates(snapshot, overrides, index_file_resolver(snapshot, uploads), offset, limit, explain,
                                  tuple(merge or ()), tuple(relation) if relation else None, full,
                                  progress=_progress() if progress else None)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    finally:
        snapshot.close()
    if as_json or explain:
        typer.echo(json.dumps(out, indent=2))
    else:
        print_report(out)
