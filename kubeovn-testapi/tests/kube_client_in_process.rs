//! The kube_client suite again, each client in-process ([`kubeovn_testapi::TestApiServer::in_process`]: no
//! socket, requests are calls into the server's handler): lists, watches, 410s and relists, a kube-runtime
//! Controller must behave exactly as over HTTP.

#[path = "kube_client.rs"]
mod kube_client;
