"""A stand-in Ctrl-C for tests: the named function of a module raises KeyboardInterrupt after `calls` calls."""


def interrupt_after(monkeypatch, module, name, calls: int):
    real = getattr(module, name)
    count = {"n": 0}

    def wrapper(*a, **k):
        count["n"] += 1
        if count["n"] > calls:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(module, name, wrapper)
