from funnel.completion.v1 import transcript_messages_pb2 as _transcript_messages_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
