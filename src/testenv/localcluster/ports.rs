//! Free loopback ports for the components.

use std::io;
use std::net::{Ipv4Addr, TcpListener};

use super::{Component, Error};
use crate::testenv::{free_port, io_error};

/// The ports each component listens on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ports {
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub api: u16,
    pub controller_manager: u16,
    pub scheduler: u16,
}

/// Distinct free ports from [`free_port`], below the ephemeral range, where no outgoing
/// connection can take one between this probe and the component's own bind. `api`, if
/// given, must be free now.
pub(super) fn reserve(api: Option<u16>) -> Result<Ports, Error> {
    let api = match api {
        Some(port) => {
            bind(port, Component::ApiServer)?;
            port
        }
        None => free_port()?,
    };
    Ok(Ports {
        etcd_client: free_port()?,
        etcd_peer: free_port()?,
        api,
        controller_manager: free_port()?,
        scheduler: free_port()?,
    })
}

fn bind(port: u16, component: Component) -> Result<TcpListener, Error> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|source| match source.kind() {
        io::ErrorKind::AddrInUse => Error::PortTaken { port, component },
        _ => io_error("binding a port on", "127.0.0.1")(source).into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_distinct_ports() {
        let ports = reserve(None).unwrap();
        let mut all = vec![
            ports.etcd_client,
            ports.etcd_peer,
            ports.api,
            ports.controller_manager,
            ports.scheduler,
        ];
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 5);
    }

    #[test]
    fn a_taken_api_port_is_a_clear_error() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = reserve(Some(port)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::PortTaken {
                    component: Component::ApiServer,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains(&port.to_string()), "{err}");
    }
}
