"""The one table of engines, and what picks, checks and loads a folder's: the only place that tells engines apart.
A folder is translated by the first engine in `ENGINES` that reads its format; our model's `generate()` reads any
other folder, and several model folders together as an ensemble."""

from collections.abc import Callable

from hf_vanilla_transformer.decoding.request import Steering
from hf_vanilla_transformer.engines.base import Translator
from hf_vanilla_transformer.engines.ctranslate2 import CTranslate2Translator
from hf_vanilla_transformer.engines.generate import ModelTranslator
from hf_vanilla_transformer.engines.onnx import OnnxTranslator
from hf_vanilla_transformer.loading import model_folder

ENGINES: tuple[type[Translator], ...] = (CTranslate2Translator, OnnxTranslator, ModelTranslator)


def translator_kind(model_paths: list[str]) -> type[Translator]:
    """The engine the folders are translated with: the first of `ENGINES` that reads the first folder; several
    folders decode together as an ensemble, which only our model's engine can (`ensembles`)."""
    kinds = [next(engine for engine in ENGINES if engine.reads(path)) for path in model_paths]
    if len(model_paths) > 1:
        alone = next((path for path, kind in zip(model_paths, kinds, strict=True) if not kind.ensembles), None)
        if alone is not None:
            raise ValueError(f"{alone} is an export; only model folders decode together as an ensemble")
    return kinds[0]


def translator_loader(
    model_path: str | list[str],
    device: str | None,
    dtype: str = "auto",
    threads: int | None = None,
    **ctranslate2_options,
) -> Callable[[], Translator]:
    """A function that loads the folder's translator: for a CTranslate2 folder (from export_ctranslate2)
    ctranslate2.Translator with `ctranslate2_options` (compute_type, inter_threads, intra_threads; None: the
    default) and `threads` as the default inter_threads, for an ONNX folder (export_onnx) ONNX Runtime with `threads`,
    for any other the model in `dtype` (`translation_dtype`); several model folders decode together as an
    ensemble (decoding/ensemble.py). What can be refused without loading is refused here, at once: an option for
    another kind of folder, an ensemble of exports, a device this machine lacks, a missing package, a compute type
    the device lacks."""
    paths = [model_folder(path) for path in ([model_path] if isinstance(model_path, str) else model_path)]
    kind = translator_kind(paths)
    options = {name: value for name, value in ctranslate2_options.items() if value is not None}
    options |= {"dtype": dtype} if dtype != "auto" else {}
    for name, value in options.items():
        if name not in kind.options:
            owner = next(engine for engine in ENGINES if name in engine.options)
            precision = f" ({kind.precision})" if kind.precision else ""
            raise ValueError(f"{name} {value} is for {owner.folders}; {paths[0]} is {kind.folder}{precision}")
    return kind.loader(paths, device, threads, options)


def load_translator(
    model_path: str | list[str],
    device: str | None,
    dtype: str = "auto",
    threads: int | None = None,
    **ctranslate2_options,
) -> Translator:
    """The folder's translator (`translator_loader`'s, loaded)."""
    return translator_loader(model_path, device, dtype, threads, **ctranslate2_options)()


def check_request(model_paths: list[str], steering: Steering, generate_kwargs: dict) -> None:
    """Refuses, in one line naming the folder, what its engine cannot do (its declared `features` and `decoding`),
    before anything is loaded or read."""
    kind = translator_kind(model_paths)
    unable = [name for name in steering.requested() if name not in kind.features]
    unable += [name for name in generate_kwargs if name not in kind.decoding]
    if unable:
        raise ValueError(f"{model_paths[0]} is translated by {kind.engine}, which cannot give {', '.join(unable)}")


class ScoringRefused(ValueError):
    """What is asked of given translations (`asked`: "scores" or "alignments") and the folder's engine cannot give."""

    def __init__(self, message: str, asked: str):
        super().__init__(message)
        self.asked = asked


def check_scoring(model_paths: list[str], asked: list[str]) -> None:
    """Refuses, in one line naming the folder, what is `asked` of given translations ("scores", "alignments") where
    the folder's engine cannot give it (its declared `scoring`: `ScoringRefused`), and an ensemble with an export
    (`translator_kind`'s ValueError), before anything is loaded or read."""
    kind = translator_kind(model_paths)
    for name in asked:
        if name not in kind.scoring:
            owners = " or ".join(engine.folders for engine in ENGINES if name in engine.scoring)
            raise ScoringRefused(f"for {owners}; {model_paths[0]} is {kind.folder}", name)
