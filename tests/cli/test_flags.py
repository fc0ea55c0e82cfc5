"""hf_vanilla_transformer.cli.flags: the flag parser, recipe files and --config_overrides (the console scripts are
tested with their modules: cli/test_translate.py, inspection/test_pictures.py, export/test_export_ctranslate2.py)."""

from dataclasses import dataclass, field

import pytest

from hf_vanilla_transformer.cli.flags import FlagParser, expand_recipe, recipe_flags
from hf_vanilla_transformer.training.arguments import parse_config_overrides


@dataclass
class RecipeArguments:
    """Flags of each kind a recipe can set: booleans, numbers, a list, a choice."""

    output_dir: str
    do_train: bool = False
    do_eval: bool = False
    fp16: bool = False
    learning_rate_scale: float = 1.0
    warmup_steps: int = 4000
    max_steps: int = -1
    train_file: list[str] = field(default_factory=list)
    normalization: str = field(default="NFKC", metadata={"choices": ["NFKC", "NFC"]})


def parser() -> FlagParser:
    return FlagParser(RecipeArguments)


RECIPE_FLAGS = [
    "--do_train",
    "true",
    "--fp16",
    "false",
    "--learning_rate_scale",
    "0.5",
    "--warmup_steps",
    "4000",
    "--train_file",
    "a.jsonl",
    "b.txt",
    "--output_dir",
    "runs/x",
]


@pytest.mark.parametrize(
    "name, text",
    [
        (
            "recipe.yaml",
            "do_train: true\nfp16: False\nlearning_rate_scale: 0.5\nwarmup_steps: 4000\n"
            "train_file: [a.jsonl, b.txt]\noutput_dir: runs/x\n",
        ),
        (
            "recipe.json",
            '{"do_train": true, "fp16": false, "learning_rate_scale": 0.5, "warmup_steps": 4000, '
            '"train_file": ["a.jsonl", "b.txt"], "output_dir": "runs/x"}',
        ),
    ],
)
def test_recipe_flags_lowercase_booleans_and_expand_lists(tmp_path, name, text):
    (tmp_path / name).write_text(text, encoding="utf-8")
    assert recipe_flags(str(tmp_path / name)) == RECIPE_FLAGS


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("missing.yaml", None, r"missing.yaml: cannot read the recipe \(No such file or directory\)$"),
        ("broken.yaml", "train_file: [a.jsonl\n", r"broken.yaml: not a valid recipe \(while parsing a flow sequence"),
        ("broken.json", '{"do_train": true', r"broken.json: not a valid recipe \(Expecting ',' delimiter"),
        ("list.yaml", "- do_train\n- true\n", r"list.yaml: a recipe is a mapping of flag names to values$"),
        ("empty.yml", "", r"empty.yml: a recipe is a mapping of flag names to values$"),
    ],
)
def test_recipe_errors_name_the_file(tmp_path, name, text, message):
    if text is not None:
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        recipe_flags(str(tmp_path / name))


@pytest.mark.parametrize(
    "text, message",
    [
        ("1: 2\n", "{recipe}: 1 is not a flag name"),
        ("max steps: 2\n", "{recipe}: 'max steps' is not a flag name"),
        ("max_steps: {a: 1}\n", "{recipe}: max_steps: {{'a': 1}} is not a value (a number, a string or true/false)"),
        ("train_file: [a, [b]]\n", "{recipe}: train_file: ['b'] is not a value (a number, a string or true/false)"),
        ("max_steps: !!python/object/apply:os.system [ls]\n", "{recipe}: not a valid recipe (could not determine a "),
        ("a: &x [1, 2]\nb: [*x, *x]\n", "{recipe}: b: [1, 2] is not a value"),
    ],
)
def test_a_recipe_that_is_no_list_of_flags_is_refused_naming_it(tmp_path, text, message):
    (tmp_path / "recipe.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as error:
        recipe_flags(str(tmp_path / "recipe.yaml"))
    assert str(error.value).startswith(message.format(recipe=tmp_path / "recipe.yaml")) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("colour: red\n", "Some specified arguments are not used by the HfArgumentParser: ['--colour', 'red']"),
        ("max_steps: [1, 2]\n", "Some specified arguments are not used by the HfArgumentParser: ['2']"),
        ("max_steps: 1.5\n", "argument --max_steps/--max-steps: invalid int value: '1.5' (see --help)"),
        (
            "learning_rate_scale: fast\n",
            "argument --learning_rate_scale/--learning-rate-scale: invalid float value: 'fast' (see --help)",
        ),
        ("do_train: maybe\n", "argument --do_train/--do-train: Truthy value expected: got maybe"),
        (
            "normalization: NFD\n",
            "argument --normalization: invalid choice: 'NFD' (choose from 'NFKC', 'NFC') (see --help)",
        ),
    ],
)
def test_the_recipes_flags_are_checked_by_argparse_as_typed_ones_are(tmp_path, text, message):
    (tmp_path / "recipe.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as error:
        parser().parse_args_into_dataclasses(expand_recipe([str(tmp_path / "recipe.yaml"), "--output_dir", "x"]))
    assert str(error.value).startswith(message) and "\n" not in str(error.value), str(error.value)


def test_a_null_value_leaves_the_flag_at_its_default_and_flag_errors_are_one_line(tmp_path):
    (tmp_path / "recipe.yaml").write_text("max_steps:\noutput_dir: x\n", encoding="utf-8")
    assert recipe_flags(str(tmp_path / "recipe.yaml")) == ["--output_dir", "x"]
    with pytest.raises(ValueError) as error:
        parser().parse_args_into_dataclasses(["--output_dir", "x", "--max_steps", "many"])
    assert str(error.value) == "argument --max_steps/--max-steps: invalid int value: 'many' (see --help)"


def test_expand_recipe_puts_the_recipes_flags_before_the_others(tmp_path):
    (tmp_path / "recipe.yml").write_text("max_steps: 100\ndo_eval: true\n", encoding="utf-8")
    recipe = str(tmp_path / "recipe.yml")
    from_recipe = ["--max_steps", "100", "--do_eval", "true"]
    assert expand_recipe([recipe, "--max_steps", "5"]) == [*from_recipe, "--max_steps", "5"]
    assert expand_recipe([recipe]) == from_recipe
    # only a first argument is a recipe; anything else is left as it is
    assert expand_recipe(["--train_file", "train.json"]) == ["--train_file", "train.json"]
    assert expand_recipe(["--max_steps", "5", recipe]) == ["--max_steps", "5", recipe]
    assert expand_recipe([]) == []


def test_parse_config_overrides_reads_yaml_scalars():
    overrides = parse_config_overrides(
        "d_model=256, dropout=0.2,position_embedding_type=learned,scale_embedding=false,head_dim=null,init_std=1e-2"
    )
    assert overrides == {
        "d_model": 256,
        "dropout": 0.2,
        "position_embedding_type": "learned",
        "scale_embedding": False,
        "head_dim": None,
        "init_std": 0.01,
    }
    assert [type(overrides[name]) for name in ("d_model", "dropout", "scale_embedding")] == [int, float, bool]
    assert parse_config_overrides(None) == parse_config_overrides("") == parse_config_overrides(",") == {}


@pytest.mark.parametrize("item", ["colour=3", "d_model", "=3"])
def test_a_bad_config_override_is_a_value_error_naming_config_overrides(item):
    with pytest.raises(ValueError) as error:
        parse_config_overrides(f"d_model=256,{item}")
    assert str(error.value) == f"config_overrides: {item!r} is not NAME=VALUE with a config attribute NAME"
