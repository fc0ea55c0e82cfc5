"""A tokenizer that notes what it is given, for the tests that a long line is cut before it is tokenized."""


class LongestText:
    """A tokenizer that notes the longest text it was given (in characters), as source or as target."""

    def __init__(self, tokenizer):
        self.tokenizer, self.longest = tokenizer, 0

    def __call__(self, text=None, **kwargs):
        for given in (text, kwargs.get("text_target")):
            if given is not None:
                self.longest = max(self.longest, *map(len, [given] if isinstance(given, str) else given))
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)
