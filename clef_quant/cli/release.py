"""`clef-quant card` and `clef-quant upload`: the last two steps of a release."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from clef_quant.cli._errors import fail, user_errors
from clef_quant.cli._options import repo_id_option
from clef_quant.formatting import binary_size

if TYPE_CHECKING:
    from clef_quant.publish.upload import UploadPlan

FolderArgument = Annotated[
    Path, typer.Argument(metavar="DIR", help="A quantized release folder made by clef-quant quantize.")
]


@user_errors
def card(
    folder: FolderArgument,
    results: Annotated[Path, typer.Option(help="RESULTS folder of clef-quant eval that evaluated DIR.")],
    throughput: Annotated[
        Path | None,
        typer.Option(
            help="A clef-quant bench throughput report to show: its JSON, or its markdown with the JSON beside it."
        ),
    ] = None,
    repo_id: Annotated[
        str | None,
        repo_id_option("Where the release will live (the quickstart names it).", show_default="<base model>-<SCHEME>"),
    ] = None,
    base_model: Annotated[
        str | None,
        typer.Option(help="Hub id of the source model, when the manifest's source is a local folder."),
    ] = None,
    license: Annotated[
        str | None, typer.Option(help="Hub license id; default: the source's card front matter.")
    ] = None,
    notice: Annotated[str | None, typer.Option(help="A warning shown first on the card.")] = None,
    plots: Annotated[bool, typer.Option(help="Draw the PNG plots (matplotlib).")] = True,
) -> None:
    """Write DIR/README.md (Hub model card) with plots, copy vllm_plugin/ (and the CPU fix of scripts/) in, add them
    to the manifest.

    Examples:
      clef-quant card artifacts/tiny-NVFP4 --results artifacts/results --base-model ORG/NAME --license apache-2.0
      clef-quant card flash-NVFP4 --results results/flash --throughput bench/results/throughput-h200.json
    """
    from clef_quant.publish.card import CardConfig, write_card

    config = CardConfig(
        folder=folder,
        results=results,
        throughput=throughput,
        base_model=base_model,
        license=license,
        repo_id=repo_id,
        notice=notice,
        plots=plots,
    )
    result = write_card(config)
    for warning in result.warnings:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    typer.echo(f"wrote {result.card} for {result.repo_id}")
    for plot in result.plots:
        typer.echo(f"  plot {folder / plot}")
    typer.echo(f"  copied {result.copied} files ({', '.join(f'{t}/' for t in _trees())}); manifest updated")
    typer.echo(f"next: clef-quant upload {folder} --repo-id {result.repo_id} --dry-run")


def _trees() -> tuple[str, ...]:
    from clef_quant.publish.folder import COPIED_TREES

    return COPIED_TREES


@user_errors
def upload(
    folder: FolderArgument,
    repo_id: Annotated[str, repo_id_option("The Hub repo to push to.")],
    private: Annotated[bool, typer.Option("--private", help="Create the repo private (if it does not exist).")] = False,
    revision: Annotated[
        str | None, typer.Option(help="Branch to commit to (created from main if missing); default main.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check DIR and print what would be created and sent; send nothing.")
    ] = False,
) -> None:
    """Push DIR to the Hub in one commit, after checking it: inspect passes, every sha256 matches, the card is there.

    The token comes from HF_TOKEN or from `hf auth login`.

    Examples:
      clef-quant upload artifacts/tiny-NVFP4 --repo-id me/clef-tiny-NVFP4 --dry-run
      clef-quant upload flash-NVFP4 --repo-id Cloudflare/clef-flash-NVFP4 --private
    """
    from clef_quant.publish.upload import ReleaseNotReady, find_token, plan_upload
    from clef_quant.publish.upload import upload as push

    if not folder.is_dir():
        raise fail(f"{folder} is not a folder")
    # Before the audit, which loads compressed-tensors and hashes every file: a missing token is answered at once.
    token = find_token()
    if token is None and not dry_run:
        raise fail("no Hugging Face token: set HF_TOKEN or run `hf auth login`", hint="--dry-run needs none")
    try:
        plan = plan_upload(folder, repo_id=repo_id, private=private, revision=revision)
    except ReleaseNotReady as exc:
        for problem in exc.problems:
            typer.secho(f"refused: {problem}", fg=typer.colors.RED, err=True)
        raise fail(str(exc)) from None
    if dry_run:
        _print_plan(plan, token is not None)
        return
    assert token is not None  # refused above unless --dry-run
    typer.echo(f"uploading {len(plan.files)} files ({binary_size(plan.total_bytes)}) to {plan.repo_id}@{plan.revision}")
    result = push(plan, token)
    typer.echo(f"committed {result.commit_oid[:12]}: {result.commit_url}")
    typer.echo(f"repo: {result.repo_url}")


def _print_plan(plan: UploadPlan, has_token: bool) -> None:
    # Plain lines, one file each: the list is meant to be read, diffed and grepped.
    visibility = "private" if plan.private else "public"
    typer.echo(f"dry run: nothing is sent. Checks passed for {plan.folder}.")
    typer.echo(f"would create {visibility} model repo {plan.repo_id} (if it does not exist)")
    if plan.new_branch:
        typer.echo(f"would create branch {plan.revision} from main (if it does not exist)")
    typer.echo(
        f"would commit {len(plan.files)} files, {binary_size(plan.total_bytes)}, to {plan.revision} in one commit:"
    )
    typer.echo(f"  message: {plan.commit_message}")
    width = max(len(str(item.size)) for item in plan.files)
    for item in plan.files:
        typer.echo(f"  {item.size:>{width}}  {item.path}")
    token = "found" if has_token else "not found (a real upload needs HF_TOKEN or `hf auth login`)"
    typer.echo(f"token: {token}")
