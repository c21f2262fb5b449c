//! Free loopback ports for the components.

use std::io;
use std::net::{Ipv4Addr, TcpListener};

use super::{Component, Error};
use crate::testenv::io_error;

/// The ports each component listens on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ports {
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub api: u16,
    pub controller_manager: u16,
    pub scheduler: u16,
}

/// Binds every port at once, so no two components get the same one, then releases them for
/// the components to take. `api`, if given, must be free now.
pub(super) fn reserve(api: Option<u16>) -> Result<Ports, Error> {
    let listeners = [
        bind(api.unwrap_or(0), Component::ApiServer)?,
        bind(0, Component::Etcd)?,
        bind(0, Component::Etcd)?,
        bind(0, Component::ControllerManager)?,
        bind(0, Component::Scheduler)?,
    ];
    let mut ports = [0; 5];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = local_port(listener)?;
    }
    let [api, etcd_client, etcd_peer, controller_manager, scheduler] = ports;
    Ok(Ports {
        etcd_client,
        etcd_peer,
        api,
        controller_manager,
        scheduler,
    })
}

fn bind(port: u16, component: Component) -> Result<TcpListener, Error> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|source| match source.kind() {
        io::ErrorKind::AddrInUse => Error::PortTaken { port, component },
        _ => io_error("binding a port on", "127.0.0.1")(source).into(),
    })
}

fn local_port(listener: &TcpListener) -> Result<u16, Error> {
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|source| io_error("reading the port of a listener on", "127.0.0.1")(source).into())
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
