"""docs/API.md cannot drift from the classes; README links resolve inside the repo."""

import re
from pathlib import Path

import pytest

import fucina as F
from fucina.tensor import apidoc

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "API.md").read_text()


def test_generated_reference_is_current():
    # Fails after any change to a method, signature or docstring until the reference is
    # regenerated with: python -m fucina.tensor.apidoc --write
    assert apidoc.current(API) == apidoc.render()
    assert apidoc.main(["--check"]) == 0


def test_every_public_method_has_a_docstring_and_a_reference_entry():
    reference = apidoc.current(API)
    count = 0
    for branch in apidoc.branch_classes():
        for cls in branch.__mro__:
            if cls is object or cls is branch:
                continue
            for name, attr in apidoc.public_members(cls):
                fn = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
                assert (fn.__doc__ or "").strip(), f"{cls.__name__}.{name} has no docstring"
                assert re.search(rf"`[xT]\.{re.escape(name)}\b", reference), name
                count += 1
    assert count > 500  # every branch's surface, counted per branch


def test_every_mixin_lists_its_dtypes():
    reference = apidoc.current(API)
    for cls in apidoc.mixins():
        if apidoc.public_members(cls):
            title = "Tensor (root)" if cls is F.Tensor else cls.__name__
            assert f"### {title}\n" in reference, title
    assert ("### Losses\n\nLosses and similarity (f32): cross-entropy (plain and fused with a "
            "linear layer), distillation, elementwise regression/classification losses, NLL, "
            "cosine. *Dtypes: f32.*") in reference
    assert "*Dtypes: bool; u8, u16, i8, i16, i32; i64" in reference


def test_a_method_without_docstring_fails_the_generator():
    def undocumented(self):  # a stand-in for a method someone forgot to document
        return self

    with pytest.raises(ValueError, match="Mixin.undocumented has no docstring"):
        apidoc._doc(undocumented, "Mixin.undocumented")


def test_check_reports_a_stale_file(tmp_path):
    stale = tmp_path / "API.md"
    stale.write_text(API.replace("Whether the type carries", "Whether the type has"))
    assert apidoc.main(["--check", "--path", str(stale)]) == 1
    assert apidoc.main(["--write", "--path", str(stale)]) == 0
    assert stale.read_text() == API


def test_root_names_are_documented():
    for name in F.__all__:
        assert f"fucina.{name}" in API or f"`{name}`" in API, name


def test_readme_links_stay_inside_the_repo():
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)]+)\)", readme)
    targets += re.findall(r"`((?:docs|examples|benchmarks)/[\w./-]+)`", readme)
    assert targets
    for t in targets:
        assert not t.startswith(("http", "..", "/")), t
        assert (ROOT / t).exists(), t
    assert "shared/" not in readme
