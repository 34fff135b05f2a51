"""The page-view sample as Protobuf in the schema registry's wire format: the events and the
invalid ones of samples/sample_avro.py, written with the two versions of ``kappa.samples.
PageView`` below (the second adds ``optional string referrer``, null where unset).

The descriptor sets are built here, as ``protoc --descriptor_set_out`` would write them for
page_view.proto; the example job's ``page_view.desc`` is the second's bytes
(tests/unit/test_sample_protobuf.py checks that it still is)."""

from __future__ import annotations

from google.protobuf import descriptor_pb2

MESSAGE = "kappa.samples.PageView"
_FIELDS = (("user_id", descriptor_pb2.FieldDescriptorProto.TYPE_INT64),
           ("url", descriptor_pb2.FieldDescriptorProto.TYPE_STRING),
           ("ts", descriptor_pb2.FieldDescriptorProto.TYPE_INT64),
           ("duration_ms", descriptor_pb2.FieldDescriptorProto.TYPE_INT64))


def page_view_descriptor_set(version: int) -> bytes:
    """The FileDescriptorSet of page_view.proto at ``version`` (1 or 2), serialized."""
    message = descriptor_pb2.DescriptorProto(name="PageView")
    for number, (name, kind) in enumerate(_FIELDS, start=1):
        message.field.add(name=name, number=number, type=kind,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                          json_name=_camel(name))
    if version == 2:  # proto3 `optional`: a synthetic oneof gives it presence
        message.oneof_decl.add(name="_referrer")
        message.field.add(name="referrer", number=5, oneof_index=0, proto3_optional=True,
                          type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                          json_name="referrer")
    file = descriptor_pb2.FileDescriptorProto(name="page_view.proto", package="kappa.samples",
                                              syntax="proto3", message_type=[message])
    written: bytes = descriptor_pb2.FileDescriptorSet(file=[file]).SerializeToString(
        deterministic=True)
    return written


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


DESCRIPTOR_SETS = (page_view_descriptor_set(1), page_view_descriptor_set(2))
