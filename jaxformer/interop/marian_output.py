"""jaxformer-convert's --output, in both directions: absent or an empty directory, checked before
anything is read, and written whole or not at all through jaxformer/staged_folder.py (the folder
jaxformer-export writes through too): staged in a hidden `.<output>.*.partial` beside it, renamed
into place once complete. A conversion killed outright (kill -9, power loss) leaves --output as it
was; the next one removes its staging folder with a warning, never reusing it."""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Callable, Iterator

from jaxformer import staged_folder
from jaxformer.files import not_a_folder_reason
from jaxformer.interop.marian_layout import ConversionError

# The entry a reader needs, moved in last where --output is a mount point (its entries moved one by
# one): a run's checkpoints (load_checkpoint), a transformers directory's config.json (from_pretrained).
RUN = staged_folder.Writer("conversion", ConversionError, last="checkpoints")
TRANSFORMERS_DIRECTORY = staged_folder.Writer("conversion", ConversionError, last="config.json")


def check_new_output(output: str | os.PathLike, writer: staged_folder.Writer) -> pathlib.Path:
    """The folder to write for --output `output`: `output` itself, or the folder a link there
    points to. `ConversionError` unless it is absent or an empty directory and can be written (a
    file above it, a link to nothing, or a folder it is staged in that takes no new entries, would
    fail only once the model is converted). Killed conversions' leftovers beside it are removed
    first, each named."""
    output = pathlib.Path(output)
    if output.is_symlink() and output.is_dir():  # written where it points, as before: the link stays
        output = pathlib.Path(os.path.realpath(output))
    killed_inside = staged_folder.remove_dead_leftovers(output, writer)
    _check_empty(output, killed_inside=killed_inside)
    reason = not_a_folder_reason(output)
    if reason:
        raise ConversionError(f"--output {output}: cannot write it: {reason}")
    # Whether the folder it is staged in (beside it, or in it where it is a mount point) takes new
    # entries is check_placeable's probe; an empty `output` itself is replaced by a rename, not written in.
    staged_folder.check_placeable(output, writer)
    return output


def _check_empty(
    output: pathlib.Path, staging: pathlib.Path | None = None, killed_inside: list[pathlib.Path] | None = None
) -> None:
    """`ConversionError` unless `output` is absent or an empty directory (its own `staging` aside).
    `killed_inside`: the staging folders of conversions into `output`, a mount point, killed before
    they were in place (`staged_folder.remove_dead_leftovers`). A conversion writes only into an
    empty folder, and into a mount point moves its files in one by one, so what such a folder holds
    is then the part one of those moved in before it was killed: the refusal says so."""
    if output.exists() and (not output.is_dir() or any(entry != staging for entry in output.iterdir())):
        if killed_inside:
            raise ConversionError(
                f"--output {output}: already exists and is not an empty directory: it holds part of a conversion "
                f"killed as it moved its files into it one by one ({output} is a mount point; the staging folder it "
                f"moved them from was {killed_inside[0]}); delete what is in {output}, then convert again"
            )
        raise ConversionError(
            f"--output {output}: already exists and is not an empty directory; give a new or empty one "
            "(nothing is replaced)"
        )


@contextlib.contextmanager
def written_whole(
    output: pathlib.Path, writer: staged_folder.Writer, on_placed: Callable[[], None] | None = None
) -> Iterator[pathlib.Path]:
    """The staging folder to write `output`'s files in; renamed to `output` when the block ends
    (still empty: nothing appeared there meanwhile), removed if it raises. `on_placed()` is called
    once it is in place, before a signal that came meanwhile is raised again."""
    with staged_folder.staging_directory(output, writer) as staging:
        yield staging
        _check_empty(output, staging)
        staged_folder.raise_held_signal()
        staged_folder.move_into_place(staging, output, writer, on_placed)
