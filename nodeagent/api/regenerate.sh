#!/bin/sh
# Regenerates the committed Python stubs next to the .proto files. Run it with grpcio-tools installed
# (a developer tool only: neither the runtime nor the tests need it). It runs protoc from the repository
# root so that the generated modules import each other as nodeagent.api.*.
set -eu
cd "$(dirname "$0")/../.."
python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. nodeagent/api/deviceplugin_v1beta1.proto nodeagent/api/podresources_v1.proto
