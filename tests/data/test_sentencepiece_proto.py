"""sentencepiece's model proto with a protobuf older than the one that generated it: one line naming
both installed versions and the pip commands, as protobuf 4 (no runtime check) and 5 or 6 (which
refuse it with a VersionError) would fail."""

from __future__ import annotations

import sys

import google.protobuf
import pytest
import sentencepiece
from google.protobuf import runtime_version

from jaxformer.data import sentencepiece_proto


@pytest.mark.parametrize("protobuf_version", ["4.25.9", "6.33.6"])
def test_a_protobuf_older_than_the_model_proto_needs_is_named_in_one_line(monkeypatch, protobuf_version):
    generated_by = []

    def refuse_as_an_older_protobuf_does(domain, major, minor, patch, suffix, location):
        generated_by.append(f"{major}.{minor}.{patch}")
        if protobuf_version.startswith("4."):  # protobuf 4 has no runtime_version module to import
            raise ImportError("cannot import name 'runtime_version' from 'google.protobuf'")
        raise runtime_version.VersionError(
            f"Detected incompatible Protobuf Gencode/Runtime versions when loading {location}: gencode "
            f"{major}.{minor}.{patch} runtime {protobuf_version}. Runtime version cannot be older than ..."
        )

    monkeypatch.setattr(runtime_version, "ValidateProtobufRuntimeVersion", refuse_as_an_older_protobuf_does)
    monkeypatch.setattr(google.protobuf, "__version__", protobuf_version)
    monkeypatch.delitem(sys.modules, sentencepiece_proto.MODEL_PROTO_MODULE)
    monkeypatch.delattr(sentencepiece, "sentencepiece_model_pb2", raising=False)
    try:
        sentencepiece_proto.model_proto_module()
    except ImportError as error:
        message = str(error)
    else:
        pytest.skip(f"sentencepiece {sentencepiece.__version__}'s model proto checks no protobuf version")
    assert generated_by, message  # the error came from the check, not from elsewhere
    needed, installed = generated_by[0], sentencepiece.__version__
    assert message == (
        f"sentencepiece {installed}'s model proto needs protobuf >= {needed}, and protobuf {protobuf_version} is "
        f'installed: pip install "sentencepiece<{installed}" (keeps this protobuf, which tensorflow may pin), or '
        f'pip install "protobuf>={needed}"'
    )
