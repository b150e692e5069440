"""Using exported models: test-set evaluation, predictions for image and IDX files, and the
`export`, `evaluate` and `predict` subcommands (see `register`).
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError, one_line

if TYPE_CHECKING:
    import torch
    from torch import nn

# torch, PIL and accelerate are imported where they are used: cli.py imports this module to build
# its parser, and a `report` or `configs` command has no use for them.

# Bigger pictures are refused from their header, before any pixel is decoded: a small file can
# claim billions of pixels (a "decompression bomb"), and a digit needs nothing near this.
MAX_PIXELS = 4096 * 4096
# The decoders untrusted files may reach; PIL knows many more, rarer and less hardened ones.
IMAGE_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP")
_IDX_OR_GZIP_MAGIC = (b"\x00\x00", b"\x1f\x8b")
_IDX_CHUNK = 1000


def evaluate_exported(
    path: str | os.PathLike, dataset: str | None = None, data_dir: str | os.PathLike | None = None,
    batch_size: int = 1000,
) -> dict[str, Any]:  # fmt: skip
    """test_loss, test_accuracy, test_samples (and the confusion matrix) of the exported model in
    `path` on the test split of `dataset` (default: the one it was trained on, where that is a
    dataset by name: data passed to train() has none).

    Runs on the available device, and shards the test set under `accelerate launch`; every
    process gets the same numbers, over exactly the test set's records.
    """
    import torch

    from ..config import TrainConfig
    from ..data.catalog import ImageTensorDataset, load_datasets, load_split
    from ..distributed.accelerator import build_accelerator
    from ..evaluation import evaluate
    from .model_dir import load_model, read_export_config

    if batch_size < 1:
        raise UsageError(f"--batch-size: must be >= 1, got {batch_size}")
    model = load_model(path)
    config = read_export_config(path)
    if dataset is None and config["dataset"].startswith("own:"):
        raise UsageError(f"{path} was trained on data passed to train() ({config['dataset'][4:]}); give --dataset")
    dataset = dataset or config["dataset"]
    if dataset.startswith("hf:"):  # Hugging Face data comes in (train, test) pairs
        test = load_datasets(dataset, data_dir, download=False)[1]
        images, labels = test.images, test.labels
    else:
        images, labels = load_split(dataset, data_dir, train=False, download=False)
    # The model's own normalisation, whatever the data: it is what its weights expect.
    test_set = ImageTensorDataset(images, labels, mean=config["mean"], std=config["std"])
    _check_data_fits(path, config, dataset, test_set)
    loader = torch.utils.data.DataLoader(test_set, batch_size=batch_size, shuffle=False)
    # The project's builder: it joins CPU processes of a launch in one process group.
    accelerator = build_accelerator(TrainConfig(batch_size=batch_size, eval_batch_size=batch_size))
    model, loader = accelerator.prepare(model, loader)
    try:
        # Under DeepSpeed fp16/bf16 the prepared weights are half precision, and so must inputs be.
        return evaluate(model, loader, accelerator, next(model.parameters()).dtype, config.get("num_classes", 10))
    finally:
        # The Accelerator keeps the prepared DDP model in reference cycles that may outlive the
        # process group; a gloo worker that frees it at exit sometimes aborts ("terminate called
        # without an active exception"), as loop.py notes. Release it while the group exists.
        accelerator.free_memory(model, loader)


def _check_data_fits(path: Any, config: dict[str, Any], dataset: str, test_set: Any) -> None:
    """The test set's images and labels must be ones the exported model can take."""
    shape, classes = config.get("input_shape", [1, 28, 28]), config.get("num_classes", 10)
    if list(test_set.input_shape) != list(shape):
        have = "x".join(map(str, test_set.input_shape))
        raise UsageError(f"{path} takes {'x'.join(map(str, shape))} images but {dataset} has {have}")
    if len(test_set.labels) and int(test_set.labels.max()) >= classes:
        raise UsageError(f"{path} knows {classes} classes but {dataset} has label {int(test_set.labels.max())}")


def predict_files(
    model: nn.Module, paths: Sequence[str | os.PathLike], mean: float, std: float,
    input_shape: Sequence[int] = (1, 28, 28),
) -> list[tuple[str, int, float]]:  # fmt: skip
    """(name, predicted class, its probability) for each image file, and for each record of an
    IDX image file (named `path[i]`); pictures are brought to `input_shape` (C, H, W), the
    model's: grayscale for one channel, RGB for three."""
    import torch

    from ..data.tensor_dataset import Normaliser
    from ..model_output import logits_of

    model.eval()
    device = next(model.parameters()).device
    results: list[tuple[str, int, float]] = []
    batches: Iterable[torch.Tensor]
    for path in map(Path, paths):
        image = _open_image(path)
        if image is not None:
            names, batches = [str(path)], [_image_tensor(image, mean, std, input_shape).unsqueeze(0)]
        else:
            records = _read_idx_images(path, input_shape)
            names = [f"{path}[{i}]" for i in range(len(records))]
            normalise = Normaliser(mean, std)
            batches = (normalise(records[i : i + _IDX_CHUNK]).unsqueeze(1) for i in range(0, len(records), _IDX_CHUNK))
        with torch.no_grad():
            for batch, start in zip(batches, range(0, len(names), _IDX_CHUNK), strict=True):
                probs = logits_of(model(batch.to(device))).float().softmax(dim=1).cpu()
                best, digits = probs.max(dim=1)
                chunk = names[start : start + len(batch)]
                results += [(n, int(d), float(p)) for n, d, p in zip(chunk, digits, best, strict=True)]
    return results


def _open_image(path: Path) -> Any:
    """The decoded image in `path`, or None when it is no image (it may be an IDX file)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    with warnings.catch_warnings():
        # PIL only warns between MAX_IMAGE_PIXELS and twice that; a warning is a refusal here.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(path, formats=IMAGE_FORMATS)  # reads the header only
        except UnidentifiedImageError:
            return None
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise UsageError(f"{path}: image too large, not decoded ({one_line(e)})") from None
        except OSError as e:
            raise UsageError(f"{path}: cannot read image ({one_line(e)})") from None
        with image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise UsageError(
                    f"{path}: image of {width}x{height} pixels is over the limit of {MAX_PIXELS}; not decoded"
                )
            try:
                image.load()
                return ImageOps.exif_transpose(image)  # photos store their rotation apart
            except (OSError, ValueError, SyntaxError, Image.DecompressionBombWarning) as e:
                raise UsageError(f"{path}: cannot decode image ({one_line(e)})") from None


def _image_tensor(image: Any, mean: float, std: float, input_shape: Sequence[int] = (1, 28, 28)) -> torch.Tensor:
    """A (C, H, W) normalised tensor of `input_shape`: grayscale in MNIST's form (a white digit
    on black) for one channel, RGB as it is for three."""
    import numpy as np
    import torch
    from PIL import Image

    from ..data.tensor_dataset import Normaliser

    if image.mode.startswith("I") or image.mode == "F":
        # 16- and 32-bit pictures: Pillow would clip them to 0..255 on conversion, not scale.
        values = np.asarray(image, dtype=np.float32)
        top = 65535.0 if image.mode.startswith("I;16") else max(float(values.max()), 255.0)
        image = Image.fromarray((values.clip(0, top) * (255.0 / top)).round().astype(np.uint8))
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        # Conversion would turn transparent areas black, under what is usually dark ink: lay
        # the picture on white paper first, as if printed.
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
    channels, height, width = input_shape
    # Stretched to the model's size rather than cropped, so that a digit filling its picture
    # keeps every stroke; MNIST's centring of the digit in a 20x20 box is not redone.
    size = (width, height)
    if channels == 3:
        rgb = np.asarray(image.convert("RGB").resize(size, Image.Resampling.LANCZOS), dtype=np.uint8)
        return Normaliser(mean, std)(torch.from_numpy(rgb.transpose(2, 0, 1).copy()))
    if channels != 1:
        raise UsageError(f"pictures become 1 (grayscale) or 3 (RGB) channels; this model takes {channels}")
    gray = np.asarray(image.convert("L").resize(size, Image.Resampling.LANCZOS), dtype=np.uint8)
    if gray.mean() > 127:
        # A bright picture is dark ink on paper, the opposite of MNIST's white on black.
        gray = 255 - gray
    return Normaliser(mean, std)(torch.from_numpy(gray.copy())).unsqueeze(0)


def _read_idx_images(path: Path, input_shape: Sequence[int] = (1, 28, 28)) -> torch.Tensor:
    """(N, H, W) uint8 records of an IDX image file, (H, W) the model's; UsageError for anything else."""
    import numpy as np
    import torch

    from ..data.idx import read_idx

    with open(path, "rb") as f:
        head = f.read(2)
    if head not in _IDX_OR_GZIP_MAGIC:
        raise UsageError(f"{path}: not an image ({', '.join(IMAGE_FORMATS)}) or IDX file")
    channels, height, width = input_shape
    if channels != 1:
        raise UsageError(f"{path}: IDX files hold grayscale images; this model takes {channels} channels")
    # Streamed and bounded: refused from its header unless (N, H, W) within the size cap.
    records = read_idx(path, shape=(None, height, width))  # a DataError names the file and the problem
    if records.ndim != 3 or records.shape[1:] != (height, width) or records.dtype != np.uint8:
        raise UsageError(
            f"{path}: expected IDX images of shape (N, {height}, {width}) uint8, found {records.shape} {records.dtype}"
        )
    return torch.from_numpy(records)


# Subcommands. cli.py adds them with `register(subparsers)` and calls `args.handler(args)`.


def register(subparsers: Any) -> None:
    """Add the `export`, `evaluate` and `predict` subcommands, each with `handler` set."""
    export = subparsers.add_parser("export", help="export a checkpoint's model to safetensors")
    export.add_argument("--checkpoint", required=True, metavar="PATH", help="a directory accelerator.save_state wrote")
    export.add_argument("--output", required=True, metavar="DIR", help="directory for the exported model")
    export.add_argument(
        "--trust-checkpoint", action="store_true",
        help="let DeepSpeed unpickle any object in its shards (only for checkpoints you trust)",
    )  # fmt: skip
    export.set_defaults(handler=_export_command)

    evaluate = subparsers.add_parser("evaluate", help="evaluate an exported model on a test set")
    evaluate.add_argument("--model-path", required=True, metavar="DIR", help="an exported model")
    evaluate.add_argument("--dataset", help="test set (default: the model's training dataset)")
    evaluate.add_argument("--data-dir", help="IDX files; default $ACCEL_MNIST_DATA_DIR, else ./data")
    evaluate.add_argument("--batch-size", type=int, default=1000, help="per process (default: 1000)")
    evaluate.set_defaults(handler=_evaluate_command)

    predict = subparsers.add_parser("predict", help="classify image (PNG, JPEG, ...) or IDX files")
    predict.add_argument("--model-path", required=True, metavar="DIR", help="an exported model")
    predict.add_argument("images", nargs="+", metavar="IMAGE", help="image or IDX image files")
    predict.set_defaults(handler=_predict_command)


def _export_command(args: argparse.Namespace) -> int:
    from .model_dir import export_from_checkpoint, read_export_config

    out = export_from_checkpoint(args.checkpoint, args.output, trust_checkpoint=args.trust_checkpoint)
    config = read_export_config(out)
    print(f"exported {config['model']} ({config['dataset']}, step {config.get('step')}) to {out}")
    return 0


def _evaluate_command(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    results = evaluate_exported(args.model_path, args.dataset, args.data_dir, args.batch_size)
    state = PartialState()
    if state.is_main_process:
        print(
            f"test_accuracy {results['test_accuracy']:.4f} test_loss {results['test_loss']:.4f} "
            f"samples {results['test_samples']}"
        )
    # Every rank past its last collective before any tears its group down: rank 1 of a two-process
    # CPU launch once aborted in teardown ("terminate called without an active exception", gloo)
    # while rank 0 was still printing.
    state.wait_for_everyone()
    state.destroy_process_group()  # a launch's processes would otherwise leave it behind
    return 0


def _predict_command(args: argparse.Namespace) -> int:
    from .model_dir import load_model, read_export_config

    model = load_model(args.model_path)
    config = read_export_config(args.model_path)
    shape, names = config.get("input_shape", [1, 28, 28]), config.get("class_names")
    for name, label, probability in predict_files(model, args.images, config["mean"], config["std"], shape):
        # A class's name where the data named them (one line per image, whatever the name holds).
        shown = " ".join(names[label].split()) if names else str(label)
        print(f"{name}\t{shown}\t{probability:.4f}")
    return 0
