#!/bin/sh
# Prints the Secrets the overlays mount, made from the local PKI of `funnel up`
# (a directory like ./funnel-data/tls); nothing is sent anywhere:
#   deploy/kubernetes/secrets-from-local-pki.sh funnel-data/tls | kubectl apply -f -
# The CA's key and the token signing key stay out: the services need neither.
set -eu
pki=${1:-funnel-data/tls}

secret() {
    name=$1
    shift
    for file; do
        set -- "$@" "--from-file=$file=$pki/$file"
        shift
    done
    echo ---
    kubectl create secret generic "$name" "$@" --dry-run=client -o yaml
}

secret funnel-lifecycle-tls ca.pem lifecycle.pem lifecycle.key client.pem client.key
secret funnel-completion-tls ca.pem completion.pem completion.key completion-identity.pem completion-identity.key
secret funnel-jwks jwks.json
