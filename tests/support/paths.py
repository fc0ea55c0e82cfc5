"""Where the repository and the shared data are (../shared/data beside the repository)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"


TATOEBA_EN_ZH = REPO_ROOT.parent / "shared" / "data" / "tatoeba-en-zh"


TRAIN, VALIDATION, TEST = (str(MULTI30K / f"{split}.jsonl") for split in ("train", "validation", "test"))


DEMO_APP = REPO_ROOT / "demo" / "app.py"
