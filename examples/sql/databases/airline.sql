CREATE TABLE airports (
  code TEXT PRIMARY KEY,
  city TEXT,
  country TEXT
);
CREATE TABLE flights (
  id INTEGER PRIMARY KEY,
  number TEXT,
  origin TEXT REFERENCES airports(code),
  destination TEXT REFERENCES airports(code),
  departure_date TEXT,
  duration_min INTEGER,
  price INTEGER,
  aircraft TEXT,
  gate TEXT
);
CREATE TABLE passengers (
  id INTEGER PRIMARY KEY,
  name TEXT,
  nationality TEXT
);
CREATE TABLE bookings (
  id INTEGER PRIMARY KEY,
  flight_id INTEGER REFERENCES flights(id),
  passenger_id INTEGER REFERENCES passengers(id),
  seat_class TEXT
);
INSERT INTO airports (code, city, country) VALUES ('LIS', 'Lisbon', 'Portugal');
INSERT INTO airports (code, city, country) VALUES ('OSL', 'Oslo', 'Norway');
INSERT INTO airports (code, city, country) VALUES ('LYS', 'Lyon', 'France');
INSERT INTO airports (code, city, country) VALUES ('OPO', 'Porto', 'Portugal');
INSERT INTO airports (code, city, country) VALUES ('KRK', 'Krakow', 'Poland');
INSERT INTO airports (code, city, country) VALUES ('KIX', 'Osaka', 'Japan');
INSERT INTO airports (code, city, country) VALUES ('DUB', 'Dublin', 'Ireland');
INSERT INTO airports (code, city, country) VALUES ('AUS', 'Austin', 'USA');
INSERT INTO airports (code, city, country) VALUES ('CDG', 'Paris', 'France');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (1, 'AG101', 'LIS', 'AUS', '2025-10-18', 68, 55, 'E190', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (2, 'AG102', 'KRK', 'DUB', '2025-04-27', 422, 809, 'B737', 'A1');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (3, 'AG103', 'CDG', 'KRK', '2025-07-20', 202, 892, 'E190', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (4, 'AG104', 'CDG', 'AUS', '2025-07-25', 57, 214, 'E190', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (5, 'AG105', 'CDG', 'LYS', '2025-02-09', 621, 317, 'A321', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (6, 'AG106', 'AUS', 'LYS', '2025-02-18', 634, 228, 'A321', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (7, 'AG107', 'OSL', 'AUS', '2025-11-02', 273, 166, 'E190', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (8, 'AG108', 'OPO', 'KRK', '2025-10-17', 257, 721, 'E190', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (9, 'AG109', 'AUS', 'OSL', '2025-11-08', 88, 743, 'B737', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (10, 'AG110', 'CDG', 'AUS', '2025-09-02', 610, 683, 'B787', 'B4');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (11, 'AG111', 'AUS', 'KIX', '2025-02-18', 682, 605, 'B737', 'A1');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (12, 'AG112', 'OSL', 'AUS', '2025-04-13', 401, 197, 'A321', 'A1');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (13, 'AG113', 'KRK', 'OPO', '2025-11-27', 512, 179, 'B787', 'A1');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (14, 'AG114', 'KIX', 'OSL', '2025-05-13', 520, 463, 'A321', 'B4');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (15, 'AG115', 'LYS', 'LIS', '2025-12-16', 277, 353, 'A321', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (16, 'AG116', 'LYS', 'CDG', '2025-07-09', 703, 246, 'A321', 'A1');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (17, 'AG117', 'OPO', 'DUB', '2025-12-28', 495, 864, 'E190', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (18, 'AG118', 'CDG', 'LIS', '2025-12-12', 56, 260, 'A321', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (19, 'AG119', 'KIX', 'OSL', '2025-11-26', 89, 512, 'E190', 'B4');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (20, 'AG120', 'AUS', 'KIX', '2025-11-05', 454, 610, 'E190', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (21, 'AG121', 'LIS', 'OSL', '2025-08-09', 438, 302, 'A320', 'C7');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (22, 'AG122', 'KIX', 'CDG', '2025-07-18', 603, 335, 'A321', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (23, 'AG123', 'LIS', 'KRK', '2025-08-12', 270, 820, 'A320', 'C7');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (24, 'AG124', 'AUS', 'CDG', '2025-06-19', 379, 370, 'A320', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (25, 'AG125', 'KIX', 'OSL', '2025-03-05', 514, 366, 'E190', 'C7');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (26, 'AG126', 'AUS', 'KRK', '2025-08-05', 682, 521, 'A320', 'B4');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (27, 'AG127', 'OPO', 'CDG', '2025-12-14', 381, 642, 'E190', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (28, 'AG128', 'CDG', 'KRK', '2025-05-22', 555, 129, 'E190', 'A1');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (29, 'AG129', 'OSL', 'CDG', '2025-12-26', 425, 257, 'A320', 'C7');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (30, 'AG130', 'AUS', 'LIS', '2025-05-22', 629, 543, 'A321', 'C7');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (31, 'AG131', 'LIS', 'DUB', '2025-01-03', 370, 583, 'B737', 'B4');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (32, 'AG132', 'OSL', 'OPO', '2025-11-26', 71, 578, 'B737', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (33, 'AG133', 'LIS', 'KRK', '2025-12-09', 201, 170, 'A321', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (34, 'AG134', 'KIX', 'OSL', '2025-11-28', 371, 819, 'B737', 'A1');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (35, 'AG135', 'OPO', 'LIS', '2025-02-05', 261, 680, 'A321', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (36, 'AG136', 'OPO', 'CDG', '2025-03-05', 120, 847, 'E190', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (37, 'AG137', 'OSL', 'LYS', '2025-08-08', 190, 348, 'B737', 'A1');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (38, 'AG138', 'KRK', 'KIX', '2025-07-23', 562, 324, 'B737', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (39, 'AG139', 'LIS', 'KIX', '2025-06-08', 438, 98, 'E190', 'A1');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (40, 'AG140', 'LYS', 'KRK', '2025-01-16', 99, 436, 'A321', NULL);
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (41, 'AG141', 'OSL', 'AUS', '2025-07-14', 232, 857, 'B737', 'B4');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (42, 'AG142', 'OSL', 'AUS', '2025-02-17', 552, 709, 'A320', 'C7');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (43, 'AG143', 'OSL', 'AUS', '2025-04-19', 564, 774, 'A320', 'D2');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (44, 'AG144', 'DUB', 'LYS', '2025-03-27', 512, 709, 'E190', 'C7');
INSERT INTO flights (id, number, origin, destination, departure_date, duration_min, price, aircraft, gate) VALUES (45, 'AG145', 'KIX', 'DUB', '2025-01-11', 625, 823, 'B737', 'A1');
INSERT INTO passengers (id, name, nationality) VALUES (1, 'Rosa Ivanova', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (2, 'Tara Garcia', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (3, 'Liam Rossi', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (4, 'Umar Haddad', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (5, 'Chloe Novak', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (6, 'Chloe Dubois', 'France');
INSERT INTO passengers (id, name, nationality) VALUES (7, 'Farid Moreau', 'France');
INSERT INTO passengers (id, name, nationality) VALUES (8, 'Maya Garcia', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (9, 'Jonas Rossi', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (10, 'Vera Chen', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (11, 'Priya Muller', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (12, 'Nora Chen', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (13, 'Quinn Larsen', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (14, 'Maya Okafor', 'France');
INSERT INTO passengers (id, name, nationality) VALUES (15, 'Ines Moreau', 'Norway');
INSERT INTO passengers (id, name, nationality) VALUES (16, 'Ben Novak', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (17, 'Priya Smith', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (18, 'Rosa Garcia', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (19, 'Tara Novak', 'France');
INSERT INTO passengers (id, name, nationality) VALUES (20, 'Nora Ivanova', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (21, 'Wei Rossi', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (22, 'Zoe Okafor', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (23, 'Wei Garcia', 'France');
INSERT INTO passengers (id, name, nationality) VALUES (24, 'Wei Silva', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (25, 'Ana Rossi', 'Portugal');
INSERT INTO passengers (id, name, nationality) VALUES (26, 'Priya Silva', 'France');
INSERT INTO passengers (id, name, nationality) VALUES (27, 'Ben Silva', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (28, 'Liam Okafor', 'USA');
INSERT INTO passengers (id, name, nationality) VALUES (29, 'Yara Smith', 'Japan');
INSERT INTO passengers (id, name, nationality) VALUES (30, 'Priya Okafor', 'Norway');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (1, 37, 2, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (2, 45, 19, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (3, 44, 15, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (4, 18, 26, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (5, 22, 16, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (6, 18, 28, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (7, 2, 8, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (8, 43, 30, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (9, 43, 25, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (10, 31, 5, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (11, 44, 7, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (12, 4, 3, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (13, 28, 1, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (14, 13, 1, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (15, 25, 3, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (16, 37, 30, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (17, 5, 27, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (18, 39, 14, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (19, 36, 30, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (20, 31, 26, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (21, 25, 6, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (22, 10, 28, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (23, 34, 2, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (24, 31, 9, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (25, 41, 30, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (26, 18, 25, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (27, 20, 2, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (28, 34, 19, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (29, 38, 6, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (30, 2, 19, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (31, 35, 10, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (32, 21, 7, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (33, 14, 26, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (34, 13, 24, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (35, 43, 3, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (36, 45, 14, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (37, 15, 16, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (38, 43, 23, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (39, 7, 27, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (40, 6, 2, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (41, 26, 27, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (42, 12, 2, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (43, 22, 23, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (44, 17, 4, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (45, 43, 30, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (46, 3, 13, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (47, 32, 11, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (48, 8, 21, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (49, 31, 7, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (50, 25, 26, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (51, 2, 18, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (52, 35, 24, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (53, 12, 13, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (54, 29, 30, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (55, 40, 11, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (56, 28, 6, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (57, 32, 25, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (58, 21, 9, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (59, 33, 3, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (60, 15, 12, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (61, 16, 21, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (62, 11, 29, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (63, 29, 17, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (64, 24, 7, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (65, 26, 28, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (66, 37, 14, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (67, 38, 21, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (68, 40, 19, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (69, 31, 7, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (70, 22, 1, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (71, 23, 20, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (72, 21, 13, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (73, 23, 12, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (74, 3, 20, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (75, 4, 18, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (76, 4, 2, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (77, 33, 11, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (78, 33, 26, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (79, 31, 7, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (80, 27, 22, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (81, 16, 27, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (82, 14, 2, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (83, 18, 25, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (84, 22, 3, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (85, 38, 12, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (86, 34, 16, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (87, 35, 1, 'first');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (88, 30, 25, 'economy');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (89, 30, 26, 'business');
INSERT INTO bookings (id, flight_id, passenger_id, seat_class) VALUES (90, 29, 23, 'economy');
