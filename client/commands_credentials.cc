#include "client/commands_credentials.h"

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/format.h"
#include "client/terminal_text.h"
#include "common/status.h"
#include "proto/json_shapes.h"

namespace dlbatch::client {
namespace {

// The token alone goes to stdout, so `TOKEN=$(dlbatch admin user add bob)`
// captures it; what to do with it goes to stderr.
absl::StatusOr<int> Add(Connection& conn, const std::string& name, bool worker,
                        bool admin) {
  v1::AddCredentialRequest request;
  request.set_name(name);
  request.set_worker(worker);
  request.set_admin(admin);
  v1::AddCredentialReply reply;
  // Not retried: a second try after a lost reply would find the name taken.
  auto ctx = conn.Context(/*deadline_ms=*/30000);
  RETURN_IF_ERROR(
      conn.Error(conn.stub()->AddCredential(ctx.get(), request, &reply)));
  std::cout << reply.token() << "\n";
  if (worker) {
    std::cerr << "worker credential '" << TerminalText(name)
              << "': start workers with DLBATCH_TOKEN set to this token (or "
                 "--token-file); it registers workers and nothing else. It "
                 "is not shown again.\n";
  } else {
    std::cerr << (admin ? "admin '" : "user '") << TerminalText(name)
              << "': give them this token for DLBATCH_TOKEN (or "
                 "--token-file). It is not shown again.\n";
  }
  return 0;
}

absl::StatusOr<int> List(Connection& conn, bool json) {
  v1::ListCredentialsReply reply;
  RETURN_IF_ERROR(conn.Error(
      conn.Call([&](v1::Scheduler::Stub* stub, grpc::ClientContext* ctx) {
        return stub->ListCredentials(ctx, v1::ListCredentialsRequest(), &reply);
      })));
  if (json) {
    Json list = Json::array();
    for (const auto& c : reply.credentials()) list.push_back(CredentialJson(c));
    PrintJson(Json{{"credentials", std::move(list)}});
    return 0;
  }
  Table table({"NAME", "KIND", "CREATED"});
  for (const auto& c : reply.credentials()) {
    table.Add({c.name(), c.worker() ? "worker" : (c.admin() ? "admin" : "user"),
               absl::FormatTime("%Y-%m-%d %H:%M",
                                absl::FromUnixMillis(c.created_ms()),
                                absl::LocalTimeZone())});
  }
  std::cout << table.Render();
  return 0;
}

absl::StatusOr<int> Revoke(Connection& conn, const std::string& name,
                           bool worker) {
  v1::RevokeCredentialRequest request;
  request.set_name(name);
  request.set_worker(worker);
  v1::RevokeCredentialReply reply;
  auto ctx = conn.Context(/*deadline_ms=*/30000);
  RETURN_IF_ERROR(
      conn.Error(conn.stub()->RevokeCredential(ctx.get(), request, &reply)));
  std::cout << "revoked " << (worker ? "worker credential '" : "user '")
            << TerminalText(name) << "'; " << reply.streams_closed()
            << " open call" << (reply.streams_closed() == 1 ? "" : "s")
            << " ended\n";
  return 0;
}

}  // namespace

void AddCredentialCommands(CLI::App* admin, const GlobalFlags* flags, int* rc) {
  struct Args {
    std::string name;
    bool admin = false;
    bool json = false;
    bool revoke = false;
  };
  auto args = std::make_shared<Args>();

  auto* user = admin->add_subcommand(
      "user",
      "Users' tokens for the scheduler's TCP listener (on its Unix socket "
      "the kernel says who calls)");
  user->require_subcommand(1);
  auto* add = user->add_subcommand(
      "add",
      "Make a token for NAME and print it (shown once; the scheduler "
      "keeps only its hash)");
  add->add_option("name", args->name, "The user (their login name)")
      ->required();
  add->add_flag("--admin", args->admin,
                "The token may act on every job and administer the cluster");
  add->callback([flags, rc, args] {
    *rc = WithConnection(*flags, [&](Connection& conn) {
      return Add(conn, args->name, /*worker=*/false, args->admin);
    });
  });
  auto* list = user->add_subcommand(
      "list", "Users and worker credentials that hold a token");
  list->add_flag("--json", args->json, "Print JSON");
  list->callback([flags, rc, args] {
    *rc = WithConnection(
        *flags, [&](Connection& conn) { return List(conn, args->json); });
  });
  auto* revoke = user->add_subcommand(
      "revoke",
      "Revoke NAME's token at once: its calls fail from now on and its open "
      "streams (diary -f, monitor, wait) end");
  revoke->add_option("name", args->name, "The user")->required();
  revoke->callback([flags, rc, args] {
    *rc = WithConnection(*flags, [&](Connection& conn) {
      return Revoke(conn, args->name, /*worker=*/false);
    });
  });

  auto* worker = admin->add_subcommand(
      "worker-token",
      "Make (or --revoke) the credential workers of a group NAME register "
      "with: it cannot submit, cancel or read jobs");
  worker
      ->add_option("name", args->name,
                   "The credential's name, e.g. a group of nodes")
      ->required();
  worker->add_flag("--revoke", args->revoke,
                   "Revoke it instead: its workers are disconnected at once");
  worker->callback([flags, rc, args] {
    *rc = WithConnection(*flags, [&](Connection& conn) {
      return args->revoke ? Revoke(conn, args->name, /*worker=*/true)
                          : Add(conn, args->name, /*worker=*/true, false);
    });
  });
}

}  // namespace dlbatch::client
