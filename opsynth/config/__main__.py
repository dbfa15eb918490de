"""``python -m opsynth.config``: regenerate ``configs/default.toml`` from the defaults."""

from pathlib import Path

from opsynth.config import render_default_toml

out = Path(__file__).resolve().parents[2] / "configs" / "default.toml"
out.write_text(render_default_toml())
print(f"wrote {out}")
