"""The README's "The model in Python" block runs as written (in a scratch folder: it saves `my-transformer`)."""

import re

from helpers import REPO_ROOT


def python_block(heading: str) -> str:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split(f"## {heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_model_in_python_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = {}
    exec(python_block("The model in Python"), names)
    model, translation, loss = names["model"], names["translation"], names["loss"]
    assert round(model.num_parameters() / 1e6, 1) == 63.0  # Table 3's base model with 37,000 tokens
    assert loss.item() > 0 and translation[0, 0].item() == model.config.decoder_start_token_id
    assert translation.shape[1] <= 1 + 4 + 50  # <s>, then at most the source length + 50 tokens
    assert (tmp_path / "my-transformer" / "model.safetensors").is_file()
    assert type(model).__name__ == "VanillaTransformerForConditionalGeneration"
