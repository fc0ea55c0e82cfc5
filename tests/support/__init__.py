"""What the test files share, by concern (fixtures are in conftest.py; tests import these directly, `from support.models
import tiny_model`: setup.cfg puts tests/ on pytest's pythonpath)."""
