"""The training progress bar (stderr): compile phases by name, then env steps (or wall seconds
under PURM) with a postfix of live figures.  Silent when disabled."""
from __future__ import annotations


class Progress:
    def __init__(self, enabled: bool, total: float, initial: float, unit: str):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit=unit, unit_scale=True, dynamic_ncols=True,
                            desc="compile", smoothing=0.1, mininterval=0.5)

    def phase(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text[:60])
            self.bar.refresh()

    def advance(self, n: float, postfix: dict) -> None:
        if self.bar is not None:
            self.bar.set_description_str("train")
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
