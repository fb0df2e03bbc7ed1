// The certificate the scheduler's TLS listener presents. By default the
// scheduler is its own certificate authority: on first start it makes a
// private CA (STATE_DIR/ca.pem, its key ca.key) and a server certificate
// signed by it (server.pem, server.key) naming every address clients may
// use; clients and workers verify the scheduler against ca.pem. Keys are
// written 0600, atomically. On later starts both are reused; the server
// certificate alone is made again (by the same CA, so clients keep working)
// when it lacks a name now asked for, nears its end, or was not signed by
// the CA. An operator may bring a certificate and key of their own instead.
#ifndef DLBATCH_SCHEDULER_RPC_TLS_CERTS_H_
#define DLBATCH_SCHEDULER_RPC_TLS_CERTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dlbatch::scheduler {

struct TlsFiles {
  std::string cert_file;  // PEM: the server certificate, then any chain
  std::string key_file;   // PEM private key
  std::string ca_file;    // what clients pass as --ca-file; empty: operator's
  bool made_ca = false;   // this start made the CA
  bool made_server = false;  // this start made the server certificate
};

// The names a server certificate for `listen_host` must carry: the host
// itself (unless it is a wildcard address, which brings every address of
// this machine's interfaces instead), `extra` (--tls-name), localhost,
// 127.0.0.1, ::1 and the host name. IP addresses come normalised.
std::vector<std::string> ServerNames(const std::string& listen_host,
                                     const std::vector<std::string>& extra);

// Checks a --tls-name: a DNS name or an IP address.
absl::Status CheckTlsName(const std::string& name);

// Makes or reuses the CA and server certificate in `dir` (see above) for
// `names`.
absl::StatusOr<TlsFiles> LoadOrCreateTls(const std::string& dir,
                                         const std::vector<std::string>& names);

// The operator's certificate (chain) and key: both must be readable PEM
// and the key must belong to the certificate.
absl::StatusOr<TlsFiles> LoadOperatorTls(const std::string& cert_file,
                                         const std::string& key_file);

// ---- inspection (pure; used by the reuse check and tests) ----

// The subjectAltName entries of the first certificate in `pem`: DNS names
// as written, IP addresses normalised ("127.0.0.1", "::1").
absl::StatusOr<std::vector<std::string>> CertNames(const std::string& pem);
// OK when the first certificate in `cert_pem` carries a valid signature by
// the key of the first certificate in `ca_pem`.
absl::Status CheckSignedBy(const std::string& cert_pem,
                           const std::string& ca_pem);
// Seconds from now until the first certificate in `pem` expires (negative:
// expired).
absl::StatusOr<int64_t> SecondsLeft(const std::string& pem);

}  // namespace dlbatch::scheduler

#endif  // DLBATCH_SCHEDULER_RPC_TLS_CERTS_H_
