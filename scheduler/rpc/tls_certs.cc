#include "scheduler/rpc/tls_certs.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/status.h"
#include "common/tls_client.h"

namespace dlbatch::scheduler {
namespace {

constexpr int64_t kDay = 24 * 3600;
constexpr int64_t kCaDays = 3650;
constexpr int64_t kServerDays = 825;
// A server certificate with less left than this is made again at start.
constexpr int64_t kRenewSeconds = 30 * kDay;

struct FreeX509 {
  void operator()(X509* x) const { X509_free(x); }
};
struct FreeKey {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct FreeBio {
  void operator()(BIO* b) const { BIO_free(b); }
};
using X509Ptr = std::unique_ptr<X509, FreeX509>;
using KeyPtr = std::unique_ptr<EVP_PKEY, FreeKey>;
using BioPtr = std::unique_ptr<BIO, FreeBio>;

absl::Status SslError(absl::string_view what) {
  const std::string errors = OpenSslErrors();
  return absl::InternalError(absl::StrCat(
      what, ": ", errors.empty() ? "unknown OpenSSL error" : errors));
}

// A normalised IP address, or empty when `text` is none.
std::string NormalIp(const std::string& text) {
  unsigned char buf[sizeof(struct in6_addr)];
  char out[INET6_ADDRSTRLEN];
  if (::inet_pton(AF_INET, text.c_str(), buf) == 1) {
    return ::inet_ntop(AF_INET, buf, out, sizeof out);
  }
  if (::inet_pton(AF_INET6, text.c_str(), buf) == 1) {
    return ::inet_ntop(AF_INET6, buf, out, sizeof out);
  }
  return "";
}

absl::StatusOr<X509Ptr> ParseCert(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    ERR_clear_error();
    return absl::InvalidArgumentError("holds no PEM certificate");
  }
  return cert;
}

absl::StatusOr<KeyPtr> ParseKey(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) {
    ERR_clear_error();
    return absl::InvalidArgumentError("holds no PEM private key");
  }
  return key;
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(bio.get(), cert) != 1) return SslError("PEM");
  return BioText(bio.get());
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr,
                               nullptr) != 1) {
    return SslError("PEM");
  }
  return BioText(bio.get());
}

absl::Status AddExt(X509* cert, X509* issuer, int nid, const std::string& v) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, v.c_str());
  if (ext == nullptr) return SslError(absl::StrCat("extension ", v));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) return SslError(absl::StrCat("extension ", v));
  return absl::OkStatus();
}

// A certificate for `key`, named `cn`, valid from an hour ago for `days`,
// with a random serial; issued by `issuer` (null: itself).
absl::StatusOr<X509Ptr> NewCert(EVP_PKEY* key, const std::string& cn,
                                int64_t days, X509* issuer) {
  X509Ptr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) return SslError("X509");
  std::unique_ptr<BIGNUM, decltype(&BN_free)> serial(BN_new(), BN_free);
  if (!serial ||
      BN_rand(serial.get(), 120, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) ==
          nullptr) {
    return SslError("serial number");
  }
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), days * kDay);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("dlbatch"),
                             -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()),
                             -1, -1, 0);
  X509_set_issuer_name(
      cert.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  if (X509_set_pubkey(cert.get(), key) != 1) return SslError("public key");
  return cert;
}

std::string HostName() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

struct CaPair {
  X509Ptr cert;
  KeyPtr key;
};

absl::StatusOr<CaPair> MakeCa(const std::string& dir) {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return SslError("CA key");
  ASSIGN_OR_RETURN(
      X509Ptr cert,
      NewCert(key.get(), absl::StrCat("dlbatch CA of ", HostName()), kCaDays,
              nullptr));
  RETURN_IF_ERROR(AddExt(cert.get(), cert.get(), NID_basic_constraints,
                         "critical,CA:TRUE,pathlen:0"));
  RETURN_IF_ERROR(AddExt(cert.get(), cert.get(), NID_key_usage,
                         "critical,keyCertSign,cRLSign"));
  RETURN_IF_ERROR(
      AddExt(cert.get(), cert.get(), NID_subject_key_identifier, "hash"));
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
    return SslError("signing the CA");
  }
  ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key.get()));
  ASSIGN_OR_RETURN(std::string cert_pem, CertPem(cert.get()));
  // The key first: a CA file without its key would be a CA nobody can use.
  RETURN_IF_ERROR(WriteFileAtomic(dir + "/ca.key", key_pem, 0600));
  RETURN_IF_ERROR(WriteFileAtomic(dir + "/ca.pem", cert_pem, 0644));
  return CaPair{std::move(cert), std::move(key)};
}

absl::Status MakeServer(const std::string& dir, const CaPair& ca,
                        const std::vector<std::string>& names) {
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return SslError("server key");
  ASSIGN_OR_RETURN(X509Ptr cert, NewCert(key.get(), names.front(), kServerDays,
                                         ca.cert.get()));
  std::vector<std::string> alt;
  for (const std::string& n : names) {
    alt.push_back(NormalIp(n).empty() ? absl::StrCat("DNS:", n)
                                      : absl::StrCat("IP:", NormalIp(n)));
  }
  RETURN_IF_ERROR(AddExt(cert.get(), ca.cert.get(), NID_basic_constraints,
                         "critical,CA:FALSE"));
  RETURN_IF_ERROR(AddExt(cert.get(), ca.cert.get(), NID_key_usage,
                         "critical,digitalSignature"));
  RETURN_IF_ERROR(
      AddExt(cert.get(), ca.cert.get(), NID_ext_key_usage, "serverAuth"));
  RETURN_IF_ERROR(AddExt(cert.get(), ca.cert.get(), NID_subject_alt_name,
                         absl::StrJoin(alt, ",")));
  RETURN_IF_ERROR(AddExt(cert.get(), ca.cert.get(),
                         NID_authority_key_identifier, "keyid:always"));
  if (X509_sign(cert.get(), ca.key.get(), EVP_sha256()) == 0) {
    return SslError("signing the server certificate");
  }
  ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key.get()));
  ASSIGN_OR_RETURN(std::string cert_pem, CertPem(cert.get()));
  RETURN_IF_ERROR(WriteFileAtomic(dir + "/server.key", key_pem, 0600));
  return WriteFileAtomic(dir + "/server.pem", cert_pem, 0644);
}

// Whether server.pem/server.key in `dir` serve `names` under `ca_pem`.
bool ServerUsable(const std::string& dir, const std::string& ca_pem,
                  const std::vector<std::string>& names) {
  auto cert_pem = ReadFile(dir + "/server.pem");
  auto key_pem = ReadFile(dir + "/server.key");
  if (!cert_pem.ok() || !key_pem.ok()) return false;
  if (!CheckSignedBy(*cert_pem, ca_pem).ok()) return false;
  auto left = SecondsLeft(*cert_pem);
  if (!left.ok() || *left < kRenewSeconds) return false;
  auto have = CertNames(*cert_pem);
  if (!have.ok()) return false;
  for (const std::string& n : names) {
    const std::string want = NormalIp(n).empty() ? n : NormalIp(n);
    if (std::find(have->begin(), have->end(), want) == have->end()) {
      return false;
    }
  }
  auto cert = ParseCert(*cert_pem);
  auto key = ParseKey(*key_pem);
  if (!cert.ok() || !key.ok()) return false;
  const bool match = X509_check_private_key(cert->get(), key->get()) == 1;
  ERR_clear_error();
  return match;
}

}  // namespace

std::vector<std::string> ServerNames(const std::string& listen_host,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> names;
  auto add = [&](const std::string& n) {
    std::string v =
        NormalIp(n).empty() ? absl::AsciiStrToLower(n) : NormalIp(n);
    if (!v.empty() && std::find(names.begin(), names.end(), v) == names.end()) {
      names.push_back(v);
    }
  };
  const std::string host = NormalIp(listen_host);
  const bool wildcard =
      listen_host.empty() || host == "0.0.0.0" || host == "::";
  if (!wildcard) add(listen_host);
  for (const std::string& n : extra) add(n);
  add(HostName());
  add("localhost");
  add("127.0.0.1");
  add("::1");
  if (wildcard) {
    struct ifaddrs* list = nullptr;
    if (::getifaddrs(&list) == 0) {
      for (struct ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
        if (a->ifa_addr == nullptr || (a->ifa_flags & IFF_UP) == 0) continue;
        char buf[INET6_ADDRSTRLEN];
        if (a->ifa_addr->sa_family == AF_INET) {
          add(::inet_ntop(
              AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr,
              buf, sizeof buf));
        } else if (a->ifa_addr->sa_family == AF_INET6) {
          auto* in6 = reinterpret_cast<sockaddr_in6*>(a->ifa_addr);
          // Link-local addresses need a zone no certificate can name.
          if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;
          add(::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf));
        }
      }
      ::freeifaddrs(list);
    }
  }
  return names;
}

absl::Status CheckTlsName(const std::string& name) {
  if (!NormalIp(name).empty()) return absl::OkStatus();
  bool ok = !name.empty() && name.size() <= 253 && name.front() != '.' &&
            name.front() != '-';
  for (char c : name) {
    ok = ok && (absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                c == '-' || c == '.' || c == '*');
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-name '", name,
        "': write a DNS name (letters, digits, '-', '.') or an IP address "
        "clients reach the scheduler by"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TlsFiles> LoadOrCreateTls(
    const std::string& dir, const std::vector<std::string>& names) {
  if (names.empty()) return absl::InvalidArgumentError("no server names");
  TlsFiles files;
  files.ca_file = dir + "/ca.pem";
  files.cert_file = dir + "/server.pem";
  files.key_file = dir + "/server.key";
  CaPair ca;
  auto ca_pem = ReadFile(files.ca_file);
  auto ca_key = ReadFile(dir + "/ca.key");
  if (ca_pem.ok() && ca_key.ok()) {
    auto cert = ParseCert(*ca_pem);
    if (!cert.ok()) return Annotate(cert.status(), files.ca_file);
    auto key = ParseKey(*ca_key);
    if (!key.ok()) return Annotate(key.status(), dir + "/ca.key");
    if (X509_check_private_key(cert->get(), key->get()) != 1) {
      ERR_clear_error();
      return absl::FailedPreconditionError(absl::StrCat(
          dir, "/ca.key is not the key of ", files.ca_file,
          "; restore the pair, or remove both to make a new CA (every "
          "client and worker then needs the new ca.pem)"));
    }
    ca.cert = std::move(*cert);
    ca.key = std::move(*key);
  } else if (ca_pem.ok() || ca_key.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "only one of ", files.ca_file, " and ", dir,
        "/ca.key exists; restore the other, or remove both to make a new CA "
        "(every client and worker then needs the new ca.pem)"));
  } else {
    ASSIGN_OR_RETURN(ca, MakeCa(dir));
    files.made_ca = true;
  }
  ASSIGN_OR_RETURN(std::string ca_text, CertPem(ca.cert.get()));
  if (files.made_ca || !ServerUsable(dir, ca_text, names)) {
    RETURN_IF_ERROR(MakeServer(dir, ca, names));
    files.made_server = true;
  }
  return files;
}

absl::StatusOr<TlsFiles> LoadOperatorTls(const std::string& cert_file,
                                         const std::string& key_file) {
  ASSIGN_OR_RETURN(std::string cert_pem, ReadFile(cert_file));
  ASSIGN_OR_RETURN(std::string key_pem, ReadFile(key_file));
  auto cert = ParseCert(cert_pem);
  if (!cert.ok()) return Annotate(cert.status(), "--tls-cert " + cert_file);
  auto key = ParseKey(key_pem);
  if (!key.ok()) return Annotate(key.status(), "--tls-key " + key_file);
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", key_file, " is not the key of --tls-cert ",
                     cert_file, "; pass the key the certificate was made for"));
  }
  TlsFiles files;
  files.cert_file = cert_file;
  files.key_file = key_file;
  return files;
}

absl::StatusOr<std::vector<std::string>> CertNames(const std::string& pem) {
  ASSIGN_OR_RETURN(X509Ptr cert, ParseCert(pem));
  std::vector<std::string> names;
  auto* alt = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  if (alt == nullptr) return names;
  for (int i = 0; i < sk_GENERAL_NAME_num(alt); ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(alt, i);
    if (g->type == GEN_DNS) {
      const ASN1_STRING* s = g->d.dNSName;
      names.emplace_back(
          reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
          static_cast<size_t>(ASN1_STRING_length(s)));
    } else if (g->type == GEN_IPADD) {
      const ASN1_STRING* s = g->d.iPAddress;
      char buf[INET6_ADDRSTRLEN];
      const int len = ASN1_STRING_length(s);
      if (len == 4 || len == 16) {
        names.emplace_back(::inet_ntop(len == 4 ? AF_INET : AF_INET6,
                                       ASN1_STRING_get0_data(s), buf,
                                       sizeof buf));
      }
    }
  }
  GENERAL_NAMES_free(alt);
  return names;
}

absl::Status CheckSignedBy(const std::string& cert_pem,
                           const std::string& ca_pem) {
  ASSIGN_OR_RETURN(X509Ptr cert, ParseCert(cert_pem));
  ASSIGN_OR_RETURN(X509Ptr ca, ParseCert(ca_pem));
  EVP_PKEY* ca_key = X509_get0_pubkey(ca.get());
  if (ca_key == nullptr || X509_verify(cert.get(), ca_key) != 1) {
    ERR_clear_error();
    return absl::FailedPreconditionError("not signed by that CA");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SecondsLeft(const std::string& pem) {
  ASSIGN_OR_RETURN(X509Ptr cert, ParseCert(pem));
  int days = 0, secs = 0;
  if (ASN1_TIME_diff(&days, &secs, nullptr, X509_get0_notAfter(cert.get())) !=
      1) {
    return SslError("certificate end date");
  }
  return int64_t{days} * kDay + secs;
}

}  // namespace dlbatch::scheduler
