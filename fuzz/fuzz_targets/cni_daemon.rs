//! Parses arbitrary bytes as the daemon's request and response (what the daemon reads from its socket, what
//! the shim reads back); whatever parses must serialise and parse back equal, and the response's HTTP status
//! must agree with its outcome.
#![no_main]

use kubeovn_cni::daemon::{command_of_path, Request, Response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<Request>(data) {
        let json = r.to_json();
        let again: Request = serde_json::from_str(&json).expect("a serialised request parses");
        assert_eq!(again, r);
        assert_eq!(
            command_of_path(r.path()).map(|c| c.as_str()),
            Some(r.command.as_str()).filter(|c| *c != "VERSION")
        );
    }
    if let Ok(r) = serde_json::from_slice::<Response>(data) {
        let again: Response =
            serde_json::from_str(&r.to_json()).expect("a serialised response parses");
        assert_eq!(again, r);
        let status = r.http_status();
        assert_eq!(status == 200, r.clone().into_outcome().is_ok());
    }
});
