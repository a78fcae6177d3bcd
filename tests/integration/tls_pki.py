"""A throwaway PKI for the TLS tests, made with the openssl CLI in a test's temporary directory
(EC P-256, valid two days):

  ca.crt/.key             the CA pdrouter's listeners, the sims and the clients trust
  other-ca.crt/.key       a CA nobody trusts
  server.crt/.key         CN=server-a, subjectAltName IP:127.0.0.1, DNS:localhost (serverAuth)
  server2.crt/.key        CN=server-b, the same names (a renewed certificate)
  client.crt/.key         CN=pdrouter-client (clientAuth), signed by ca
  rogue-client.crt/.key   CN=rogue-client (clientAuth), signed by other-ca
  server-chain.crt        server.crt then ca.crt (a chain file as operators write them)

and ssl contexts for Python clients.
"""
import os
import shutil
import ssl
import subprocess

from pdrouter_fixture import TIME_SCALE

OPENSSL = shutil.which("openssl")
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def openssl(directory, *args):
    subprocess.run([OPENSSL, *args], cwd=directory, check=True, timeout=60 * TIME_SCALE,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _leaf(directory, name, cn, ext, ca):
    with open(os.path.join(directory, name + ".ext"), "w") as f:
        f.write(ext)
    openssl(directory, "req", *EC, "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn)
    openssl(directory, "x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
            "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", name + ".ext")


def make_pki(directory):
    for ca in ("ca", "other-ca"):
        openssl(directory, "req", "-x509", *EC, "-keyout", ca + ".key", "-out", ca + ".crt",
                "-days", "2", "-subj", "/CN=pdrouter test " + ca)
    server_ext = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    client_ext = "extendedKeyUsage=clientAuth\n"
    _leaf(directory, "server", "server-a", server_ext, "ca")
    _leaf(directory, "server2", "server-b", server_ext, "ca")
    _leaf(directory, "client", "pdrouter-client", client_ext, "ca")
    _leaf(directory, "rogue-client", "rogue-client", client_ext, "other-ca")
    with open(os.path.join(directory, "server-chain.crt"), "w") as out:
        for name in ("server.crt", "ca.crt"):
            with open(os.path.join(directory, name)) as f:
                out.write(f.read())
    return directory


def client_context(pki, ca="ca.crt", cert=None, alpn=("http/1.1",)):
    """A client context trusting `ca`, presenting `cert` (a name like "client": .crt and .key)."""
    context = ssl.create_default_context(cafile=os.path.join(pki, ca))
    if cert:
        context.load_cert_chain(os.path.join(pki, cert + ".crt"), os.path.join(pki, cert + ".key"))
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context


def peer_cn(sock):
    """The CN of the certificate an ssl socket's peer presented."""
    subject = dict(item[0] for item in sock.getpeercert()["subject"])
    return subject["commonName"]
