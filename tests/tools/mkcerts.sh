#!/usr/bin/env bash
# mkcerts.sh DIR: a throwaway PKI for the TLS tests, made with the openssl
# command (nothing here is ever a real secret).
#
#   ca.crt ca.key            the test CA
#   server.crt server.key    CN=localhost, SAN DNS:localhost IP:127.0.0.1
#                            IP:::1, signed by the CA
#   server2.crt server2.key  the same names, a second key (a SIGHUP swap)
#   client.crt client.key    CN=alice (a client certificate; CN names a user)
#   other-ca.crt other-ca.key, other.crt other.key
#                            a second CA and a "localhost" server signed by
#                            it: a client trusting ca.crt must refuse it
#   wrongname.crt .key       signed by the CA, for CN/SAN "elsewhere.test"
#   expired.crt expired.key  signed by the CA, valid 2020-01-01..2020-01-02
#   bad.crt                  not a certificate (load failure)
set -euo pipefail

dir=${1:?usage: mkcerts.sh DIR}
mkdir -p "$dir"
cd "$dir"

q() { "$@" >/dev/null 2>&1 || { echo "mkcerts: failed: $*" >&2; exit 1; }; }

key() { q openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }

# ca NAME CN: a self-signed CA certificate.
ca() {
    key "$1.key"
    q openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 3650 \
        -addext basicConstraints=critical,CA:TRUE \
        -addext keyUsage=critical,keyCertSign,cRLSign -out "$1.crt"
}

# leaf NAME CN SAN CA [openssl x509 options...]: a certificate signed by CA.
leaf() {
    local name=$1 cn=$2 san=$3 ca=$4
    shift 4
    key "$name.key"
    q openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\n' "$san" >"$name.ext"
    q openssl x509 -req -in "$name.csr" -CA "$ca.crt" -CAkey "$ca.key" \
        -CAcreateserial -days 3650 -extfile "$name.ext" -out "$name.crt" "$@"
    rm -f "$name.csr" "$name.ext"
}

here='DNS:localhost,IP:127.0.0.1,IP:::1'
ca ca "redlockd test CA"
ca other-ca "another test CA"
leaf server localhost "$here" ca
leaf server2 localhost "$here" ca
leaf client alice "DNS:alice" ca
leaf other localhost "$here" other-ca
leaf wrongname elsewhere.test "DNS:elsewhere.test" ca

# An expired certificate: `openssl ca` is the command that takes explicit
# dates, and it wants a small database of its own.
mkdir -p expired-db
: >expired-db/index.txt
echo 1000 >expired-db/serial
cat >expired-db/ca.cnf <<CNF
[ ca ]
default_ca = test
[ test ]
database = expired-db/index.txt
serial = expired-db/serial
new_certs_dir = expired-db
certificate = ca.crt
private_key = ca.key
default_md = sha256
policy = any
copy_extensions = copy
[ any ]
commonName = supplied
CNF
key expired.key
q openssl req -new -key expired.key -subj "/CN=localhost" \
    -addext "subjectAltName=$here" -out expired.csr
q openssl ca -batch -config expired-db/ca.cnf -in expired.csr \
    -startdate 20200101000000Z -enddate 20200102000000Z -out expired.crt
rm -rf expired.csr expired-db

echo "this is not a certificate" >bad.crt
chmod 600 ./*.key
