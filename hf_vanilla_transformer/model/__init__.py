"""The model: what every saved model folder carries as its code, copied flat beside the weights, so that
`from_pretrained(folder, trust_remote_code=True)` and `pipeline()` load it where this package is not installed. These
three files import nothing else of the package (tests/contracts/test_layout.py checks it), only each other.

- configuration_vanilla_transformer.py: `VanillaTransformerConfig`, its presets and the releases it needs;
- modeling_vanilla_transformer.py: the model, in the paper's order (Sections 3.1 to 6.1);
- pipeline_translation.py: `pipeline("translation")` for it.
"""
